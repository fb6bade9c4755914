"""The simulated engine's HTTP shell: vLLM 0.32's OpenAI server around the pure batching core.

A driver task runs the core: each step takes its cost-model duration x `time_scale` of wall
time (scale 1 is real time), then its tokens go to the waiting responses. Routes, as vLLM serves
them (`simengine.routes`; 404 for an unknown path, 405 with `Allow` for a known one):
`/v1/chat/completions`, `/v1/completions` and `/v1/responses` (`simengine.responsesapi`)
(vLLM's request checks and error shapes, `simengine.protocol`; stream or not, usage, n
choices and lists of prompts, each choice its own sequence in the core; seed; max_tokens up
to the context; stop strings and token ids, ignore_eos, min_tokens (`simengine.output`);
logprobs; response_format and tools by guided decoding (`simengine.guided`,
`simengine.toolcall`); priority; PD `kv_transfer_params`),
`/tokenize`, `/detokenize`, `/v1/models`, `/health`, `/version`, `/metrics` (vLLM's names,
labels and buckets, `simengine.metrics`), and the loopback-only admin and PD routes
`/admin/faults`, `/admin/steps`, `/internal/kv/release`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from kvblocks.events import EventBatch
from physics.costmodel import LinkCost
from simengine import pd, protocol, responsesapi, routes, tokens
from simengine.core import EngineConfig, EngineCore, StepResult
from simengine.faults import Faults
from simengine.kvread import KvReader
from simengine.lora import Adapters, LoraModule
from simengine.metrics import EngineMetrics, Finished
from simengine.nixlmetrics import NixlMetrics
from simengine.output import Token
from simengine.responses import Choice
from simengine.serving import Live, choices_for, stream, whole
from simengine.tokenize import detokenize, tokenize
from simengine.toolcall import ToolSetup
from topology import Topology
from wire.errors import ApiError, error_body
from wire.http import serve
from wire.kvevents import KvEventsConfig, Publisher
from wire.reader import Request
from wire.responder import Responder

log = logging.getLogger("isleserve.engine")
GIVEN_UP_MAX = 4096
ID_PREFIXES = {"chat": "chatcmpl-", "completion": "cmpl-", "responses": "resp_"}
"""A request's id starts as vLLM's do (`chatcmpl-...`, `cmpl-...`, `resp_...`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineIdentity:
    served_model: str
    engine_id: str
    role: str = "mixed"
    host: str = "127.0.0.1"
    port: int = 0
    placement: pd.Placement | None = None
    topology: Topology | None = None
    kv_hold_s: float = 60.0
    tools: ToolSetup = field(default_factory=ToolSetup)
    """`--tool-call-parser` and `--enable-auto-tool-choice`, off as in vLLM."""
    reasoning_parser: str | None = None
    """`--reasoning-parser`: taken as vLLM takes it; the simulated model writes no reasoning."""
    source_model: str = ""
    """The catalogue model it simulates (`--model`), as vLLM names the model it loaded."""
    admin_routes: bool = False
    """`/admin/faults` and `/admin/steps` (fault injection and step records for tests and chaos
    runs); without them those paths are unknown (404), as on a vLLM server."""
    api_key: str = field(default="", repr=False)
    """When set (`VLLM_API_KEY`, as vLLM reads it), every path under /v1 needs it as a bearer."""
    admin_token: str = field(default="", repr=False)
    """When set (`ISLE_ENGINE_ADMIN_TOKEN`, as the controller starts its engines), the admin
    routes need `Authorization: Bearer <it>` (401 otherwise)."""
    kv_events: KvEventsConfig | None = None
    """`--kv-events-config`: publish the prefix cache's events as vLLM does (`wire.kvevents`)."""
    lora_modules: tuple[LoraModule, ...] = ()
    """`--lora-modules`: adapters registered at start (needs `EngineConfig.lora`)."""
    lora_runtime: bool = False
    """`VLLM_ALLOW_RUNTIME_LORA_UPDATING`: serve /v1/load_lora_adapter and /v1/unload_lora_adapter."""
    kv_load_failure_policy: str = "fail"
    """vLLM's kv_transfer_config field: a failed KV read fails the request, or `recompute`s it."""


class SimEngine:
    def __init__(self, config: EngineConfig, identity: EngineIdentity, time_scale: float = 1.0) -> None:
        self.config, self.id, self.time_scale = config, identity, time_scale
        self.core = EngineCore(config)
        self.limits = protocol.Limits(identity.served_model,
                                      min(config.model.max_context, self.core.total_blocks * config.block_size),
                                      identity.source_model)
        """max_model_len: the model's context, cut to what the KV cache holds (vLLM's auto-fit)."""
        self.metrics = EngineMetrics(identity.served_model, self.limits.max_model_len)
        self.faults = Faults()
        self.nixl = NixlMetrics(self.metrics.registry, identity.served_model, eager=identity.role != "mixed")
        self.kv_reader = KvReader(model=config.model, tp=config.tp, block_size=config.block_size,
                                  topology=identity.topology, placement=identity.placement, metrics=self.nixl,
                                  faults=self.faults, policy=identity.kv_load_failure_policy, time_scale=time_scale,
                                  finished_error=self.metrics.success["error"].inc)
        self.live: dict[str, tuple[Live, Choice]] = {}
        self.steps: deque[dict[str, Any]] = deque(maxlen=4096)
        self.wake = asyncio.Event()
        self.wall0 = 0.0
        self.server: asyncio.Server | None = None
        self.port = identity.port
        self._ids = itertools.count()
        self._driver: asyncio.Task[None] | None = None
        self.publisher: Publisher | None = None
        self.adapters = Adapters(identity.served_model, self.core.lora, time_scale) \
            if self.core.lora is not None else None
        """The adapters requests may name (`simengine.lora`); None without --enable-lora."""
        if self.adapters is not None:
            self.adapters.static(identity.lora_modules)
        self._held_at: dict[str, float] = {}
        self._by_client: dict[str, str] = {}
        """A PD prefill's client-given `request_id` -> this engine's id for it (while held)."""
        self._given_up: dict[str, float] = {}
        """Ids released before this engine held their KV (the client left mid-prefill): freed
        as soon as the prefill ends. Kept kv_hold_s at most, GIVEN_UP_MAX of them."""

    # lifecycle
    async def start(self) -> None:
        self.wall0 = time.monotonic()
        events = self.id.kv_events
        if events is not None:
            self.publisher = Publisher(events.endpoint, events.replay_endpoint, events.topic, events.buffer_steps)
            self.publisher.start()
        self.server = await serve(self.handle, self.id.host, self.port)
        self.port = self.server.sockets[0].getsockname()[1]
        self._driver = asyncio.get_running_loop().create_task(self._drive())

    async def stop(self) -> None:
        if self._driver is not None:
            self._driver.cancel()
        if self.server is not None:
            self.server.close()
        if self.publisher is not None:
            await self.publisher.close()
            self.publisher = None

    async def _publish(self) -> None:
        """The prefix cache's events since the last step, one batch (dropped without a publisher)."""
        events, self.core.kv_events = self.core.kv_events, []
        if events and self.publisher is not None:
            if self.adapters is not None:  # an adapter's blocks carry its id too, as vLLM's do
                events = [self.adapters.with_id(e) for e in events]
            await self.publisher.publish(EventBatch(time.time(), tuple(events)))

    def set_link_factor(self, factor: float) -> None:
        """A degraded TP link: `factor` of its bandwidth, latency divided by it."""
        base = self.config.link
        self.core.link = LinkCost(bandwidth_gb_s=base.bandwidth_gb_s * factor, latency_us=base.latency_us / factor)

    async def set_accepting(self, accept: bool) -> None:
        if accept:
            if self.server is None or not self.server.is_serving():
                self.server = await serve(self.handle, self.id.host, self.port)
        elif self.server is not None:
            self.server.close()  # stop listening (connect: refused); open connections carry on

    @property
    def url(self) -> str:
        return f"http://{self.id.host}:{self.port}"

    def virtual_now(self) -> float:
        return (time.monotonic() - self.wall0) / self.time_scale

    # the driver
    async def _drive(self) -> None:
        while True:
            await self.faults.wait_if_stalled()
            nxt = self.core.next_ready_s()
            if nxt is None:
                self.wake.clear()
                await self.wake.wait()  # a new request set core.now to its arrival: step from there
                continue
            if nxt > self.core.now:  # only KV transfers in flight: wait for the first to land
                self.wake.clear()
                delay = self.wall0 + nxt * self.time_scale - time.monotonic()
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.wake.wait(), delay)
                    if self.wake.is_set():  # new work arrived first
                        self.core.advance_to(min(nxt, self.virtual_now()))
                        continue
                self.core.advance_to(nxt)
            self.core.slowdown = self.faults.slowdown
            result = self.core.step()
            if result is None:
                # Blocked: nothing fits until a request finishes, is aborted or released, or held
                # KV expires. Wait for one of those; never spin.
                if self._expire_held():
                    continue  # blocks came free: try again now
                self.core.advance_to(self.virtual_now())
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), self._next_expiry_s())
                continue
            await asyncio.sleep(max(0.0, self.wall0 + self.core.now * self.time_scale - time.monotonic()))
            self._emit(result)
            self._expire_held()
            await self._publish()

    def _emit(self, result: StepResult) -> None:
        self.steps.append({"start_s": result.start_s, "duration_s": result.duration_s,
                           "prefill_tokens": result.prefill_tokens, "decode_seqs": result.decode_seqs})
        end = result.start_s + result.duration_s
        m = self.metrics
        m.iteration.observe(result.prefill_tokens + len(result.tokens))
        if result.preempted:
            m.preemptions.inc(len(result.preempted))
        for rid in result.preempted:
            if (entry := self.live.get(rid)) is not None:
                entry[1].preemptions += 1
        for rid in result.admitted:
            if (entry := self.live.get(rid)) is not None and entry[1].scheduled_v is None:
                entry[1].scheduled_v = result.start_s
        for rid in result.tokens:
            entry = self.live.get(rid)
            if entry is None:
                continue
            live, c = entry
            t = c.out.next()
            if c.first_v is None:
                c.first_v = end
                m.ttft.observe(end - c.arrival_v)
                m.prompt_tokens.inc(c.prompt_tokens)
            else:
                m.itl.observe(end - (c.last_v or end))
            c.last_v = end
            m.generation_tokens.inc()
            if live.req.sampling.logprobs is not None:
                c.tokens.append(t)
            if t.finish:
                self.core.stop(rid)  # ended early (EOS, stop): the core lets it go now
                self._finished(live, c, t)
            live.queue.put_nowait((c, t))
            self.faults.count_token()
        m.state(self.core.num_running, self.core.num_waiting, self.core.kv_usage)
        m.prefix_totals(self.core.prefix_queries, self.core.prefix_hits)
        self._lora_state()

    def _finished(self, live: Live, c: Choice, t: Token) -> None:
        self.metrics.finished(Finished(
            reason=t.finish or "length", arrival_s=c.arrival_v, scheduled_s=c.scheduled_v or c.arrival_v,
            first_s=c.first_v or c.arrival_v, last_s=c.last_v or c.arrival_v, prompt_tokens=c.prompt_tokens,
            generation_tokens=c.emitted, preemptions=c.preemptions, max_tokens_param=live.req.sampling.max_tokens))
        siblings = [s for s in live.choices if s.prompt == c.prompt]
        if all(s.out.finish for s in siblings):
            self.metrics.prompt_finished(len(siblings), max(s.emitted for s in siblings))

    def _expire_held(self) -> bool:
        """Free the KV no decode claimed in time; True when anything was freed."""
        now = time.monotonic()
        freed = False
        for rid, at in list(self._held_at.items()):
            if now - at > self.id.kv_hold_s:
                freed = self.core.release(rid) or freed
                self.nixl.kv_expired()
                del self._held_at[rid]
        if self._by_client:
            self._by_client = {k: v for k, v in self._by_client.items() if v in self._held_at}
        for rid, at in list(self._given_up.items()):
            if now - at > self.id.kv_hold_s:
                del self._given_up[rid]
        return freed

    def _next_expiry_s(self) -> float | None:
        if not self._held_at:
            return None
        return max(0.01, min(self._held_at.values()) + self.id.kv_hold_s - time.monotonic() + 0.01)

    # routes
    async def handle(self, request: Request, response: Responder) -> None:
        if self.id.api_key and request.path.startswith(routes.GUARDED_PREFIXES) and not routes.bearer_is(
                request, self.id.api_key):
            response.send(401, routes.UNAUTHORIZED)  # before the route: as vLLM's middleware
            return
        if routes.refuse_route(request, response, admin=self.id.admin_routes, lora=self.id.lora_runtime):
            return
        if self.id.admin_token and request.path.startswith(routes.ADMIN_PREFIX) and not routes.bearer_is(
                request, self.id.admin_token):
            response.send(401, error_body(401, "Unauthorized", "the admin routes need the engine's admin token"))
            return
        route = (request.method, request.path)
        try:
            if route == ("POST", "/v1/chat/completions"):
                await self._generate(request, response, "chat")
            elif route == ("POST", "/v1/completions"):
                await self._generate(request, response, "completion")
            elif route == ("POST", "/v1/responses"):
                await self._generate(request, response, "responses")
            elif route == ("POST", "/tokenize"):
                response.send(200, json.dumps(tokenize(routes.json_body(request), self.limits)).encode())
            elif route == ("POST", "/detokenize"):
                response.send(200, json.dumps(detokenize(routes.json_body(request), self.limits)).encode())
            elif route == ("GET", "/v1/models"):
                response.send(200, routes.models_body(self.id.served_model, self.limits.max_model_len,
                                                      self.adapters.cards if self.adapters is not None else None))
            elif route == ("POST", "/v1/load_lora_adapter"):
                response.send(200, await self._lora_registry().load_route(routes.json_body(request)), routes.TEXT)
            elif route == ("POST", "/v1/unload_lora_adapter"):
                response.send(200, self._lora_registry().unload_route(routes.json_body(request)), routes.TEXT)
            elif route == ("GET", "/health"):
                response.send(200, b"")
            elif route == ("GET", "/version"):
                response.send(200, routes.version_body())
            elif route == ("GET", "/metrics"):
                self.metrics.state(self.core.num_running, self.core.num_waiting, self.core.kv_usage)
                self._lora_state()
                response.send(200, self.metrics.render(), "text/plain; version=0.0.4; charset=utf-8")
            elif route == ("POST", "/internal/kv/release"):
                self._release(request, response)
            elif request.path == "/admin/faults":
                self._faults(request, response)
            else:  # GET /admin/steps
                response.send(200, json.dumps(list(self.steps)).encode())
        except ApiError as err:
            if not response.started:
                response.send(err.status, err.body())

    def _lora_state(self) -> None:
        slots = self.core.lora
        if slots is not None:
            self.metrics.lora_state(slots.spec.max_loras, (s.lora for s in self.core.running if s.lora),
                                    (s.lora for s in self.core.waiting if s.lora))

    def _lora_registry(self) -> Adapters:
        if self.adapters is None:  # vLLM's engine refuses add_lora without a LoRA config
            raise ApiError(500, "LoRA is not enabled. Use --enable-lora to enable LoRA.", "InternalServerError")
        return self.adapters

    def _faults(self, request: Request, response: Responder) -> None:
        if request.method == "POST":
            try:
                self.faults.apply(json.loads(request.body or b"{}"), self)
            except (ValueError, TypeError) as err:
                raise ApiError(400, f"bad fault: {err}") from None
        response.send(200, json.dumps(self.faults.describe()).encode())

    def _release(self, request: Request, response: Responder) -> None:
        try:
            body = json.loads(request.body)
            rid = str(body["request_id"])
        except (ValueError, KeyError, TypeError):
            raise ApiError(400, "release wants {\"request_id\": ...}") from None
        if body.get("engine_id") not in (None, self.id.engine_id):
            raise ApiError(404, f"engine {self.id.engine_id} holds no KV for request {rid}", "not_found_error")
        own = rid if rid in self.core.held else self._by_client.pop(rid, rid)
        if not self.core.release(own):
            if len(self._given_up) < GIVEN_UP_MAX:
                self._given_up[rid] = time.monotonic()  # if its prefill is still running: free it when done
            raise ApiError(404, f"engine {self.id.engine_id} holds no KV for request {rid}", "not_found_error")
        self._held_at.pop(own, None)
        self.wake.set()  # blocks freed: a waiting request may fit now
        response.send(200, json.dumps({"released": rid}).encode())

    async def _generate(self, request: Request, response: Responder, kind: str) -> None:
        if self.faults.fail_status:
            raise ApiError(self.faults.fail_status, "injected failure (admin fault fail_requests)", "server_error")
        asked = routes.json_body(request)
        body = responsesapi.as_chat(asked, self.limits.max_model_len, self.id.tools) if kind == "responses" \
            else asked
        req = protocol.read(body, "chat" if kind == "responses" else kind)
        adapter = req.model if self.adapters is not None and req.model in self.adapters.loaded else None
        budgets = protocol.check(req, body, self.limits, self.id.tools, adapter is not None)
        params = req.kv_transfer_params
        if params and req.sequences > 1:
            raise ApiError(400, "kv_transfer_params take one sequence: n=1 and one prompt", "BadRequestError",
                           "kv_transfer_params")
        rid = f"{ID_PREFIXES[kind]}{self.id.engine_id}-{next(self._ids)}"
        live = Live(req=req, rid=rid, model=adapter or self.id.served_model,
                    choices=choices_for(req, rid, budgets, self.id.tools))
        ready_after, remote_prefill = 0.0, False
        if pd.wants_remote_prefill(params):
            ready_after, remote_prefill = await self._claim(params or {}, live.choices[0].prompt_tokens, live)
        hold = pd.wants_remote_decode(params)
        if not self.core.has_work():
            self.core.advance_to(self.virtual_now())  # it sat idle: catch virtual time up
        arrival = min(self.core.now, self.virtual_now())  # while a step runs, core.now is already its end
        try:
            for c in live.choices:
                ids = tuple(tokens.encode(req.prompts[c.prompt].key)) if self.core.cache is not None else ()
                self.core.add(c.rid, c.prompt_tokens, c.max_tokens, req.priority, ready_after, remote_prefill, hold,
                              token_ids=ids, lora=adapter)
                c.arrival_v = arrival
                self.live[c.rid] = (live, c)
        except ValueError as err:
            self._drop(live)
            raise ApiError(400, str(err), "BadRequestError", "max_tokens") from None
        self.wake.set()
        log.debug("request %s: %d sequences, %d prompt tokens, max_tokens %s, priority %d", rid, len(live.choices),
                  live.choices[0].prompt_tokens, budgets, req.priority)
        try:
            if kind == "responses" and req.stream:
                await responsesapi.stream(live, response, asked, self.faults)
            elif kind == "responses":
                await responsesapi.whole(live, response, asked, self._extra, self.faults)
            elif req.stream:
                await stream(live, response, self._extra, self.faults)
            else:
                await whole(live, response, self._extra, self.faults)
        finally:
            self._settle(live, hold)

    def _drop(self, live: Live) -> None:
        """Abort whatever of this request is still in the core (the client left, the engine failed)."""
        for c in live.choices:
            self.live.pop(c.rid, None)
            if not c.out.finish:
                self.core.abort(c.rid)  # free its blocks
                self.wake.set()

    def _settle(self, live: Live, hold: bool) -> None:
        c, req = live.choices[0], live.req
        if hold and c.out.finish:
            self.live.pop(c.rid, None)
            if self._given_up.pop(c.rid, None) is not None or (
                    req.request_id is not None and self._given_up.pop(req.request_id, None) is not None):
                self.core.release(c.rid)  # released while it ran: nobody will claim it
                self.wake.set()
            else:
                self._held_at[c.rid] = time.monotonic()
                if req.request_id is not None:
                    self._by_client[req.request_id] = c.rid
            return
        self._drop(live)

    async def _claim(self, params: dict[str, Any], prompt_tokens: int, live: Live) -> tuple[float, bool]:
        pd.check_decode_params(params)
        from simengine.claim import claim_blocks

        await claim_blocks(params)
        read = await self.kv_reader.read(params, prompt_tokens)  # a failed read under policy `fail` raises
        live.kv_ms = read.ms
        log.debug("KV of %d tokens from %s: %.2f ms", prompt_tokens, params["remote_engine_id"], read.ms)
        return read.ms / 1000.0, read.remote_prefill

    def _extra(self, live: Live) -> dict[str, Any]:
        """What vLLM adds to a response (`kv_transfer_params`, here only when there are some) and what
        the simulated engine adds: `isle_timing`, the first choice's modelled timing in ms and the
        engine's time scale."""
        c = live.choices[0]
        first, last = c.first_v, c.last_v or c.arrival_v
        timing = {"ttft_ms": round(((first or c.arrival_v) - c.arrival_v) * 1000, 3),
                  "tpot_ms": round((last - (first or last)) * 1000 / max(1, c.emitted - 1), 3),
                  "kv_transfer_ms": round(live.kv_ms, 3), "e2e_ms": round((last - c.arrival_v) * 1000, 3),
                  "time_scale": self.time_scale}
        extra: dict[str, Any] = {"isle_timing": timing}
        if pd.wants_remote_decode(live.req.kv_transfer_params):
            extra["kv_transfer_params"] = pd.prefill_params(
                self.id.engine_id, c.rid, self.id.host, self.port, self.config.tp,
                -(-c.prompt_tokens // self.config.block_size), c.prompt_tokens, self.id.placement)
        return extra
