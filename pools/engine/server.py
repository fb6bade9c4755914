"""The simulated engine's HTTP shell: vLLM's OpenAI routes around the pure batching core.

A driver task runs the core: each step takes its cost-model duration x `time_scale` of wall
time (scale 1 is real time), then its tokens go to the waiting responses. Routes:
`/v1/completions`, `/v1/chat/completions` (stream or not, usage, `stream_options`,
`max_tokens`, `priority`, `n=1`, `kv_transfer_params`), `/v1/models`, `/health`, `/metrics`
(vLLM's names), and the loopback-only admin and PD routes `/admin/faults`, `/admin/steps`,
`/internal/kv/release`.
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

from pools.costmodel import LinkCost
from pools.engine import pd
from pools.engine.core import EngineConfig, EngineCore, StepResult
from pools.engine.faults import Faults
from pools.engine.metrics import EngineMetrics
from pools.engine.text import TokenText, seed_for
from pools.wire import openai as wire
from pools.wire.http import Request, Responder, serve
from topology import Topology

log = logging.getLogger("isleserve.engine")
GIVEN_UP_MAX = 4096


@dataclass(slots=True)
class _Live:
    req: wire.GenerationRequest
    rid: str
    prompt_tokens: int
    text: TokenText
    queue: asyncio.Queue[tuple[str, str | None]] = field(default_factory=asyncio.Queue)
    arrival_v: float = 0.0
    first_v: float | None = None
    last_v: float | None = None
    kv_ms: float = 0.0
    emitted: int = 0


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


class SimEngine:
    def __init__(self, config: EngineConfig, identity: EngineIdentity, time_scale: float = 1.0) -> None:
        self.config, self.id, self.time_scale = config, identity, time_scale
        self.core = EngineCore(config)
        self.metrics = EngineMetrics(identity.served_model)
        self.faults = Faults()
        self.live: dict[str, _Live] = {}
        self.steps: deque[dict[str, Any]] = deque(maxlen=4096)
        self.wake = asyncio.Event()
        self.wall0 = 0.0
        self.server: asyncio.Server | None = None
        self.port = identity.port
        self._ids = itertools.count()
        self._driver: asyncio.Task[None] | None = None
        self._held_at: dict[str, float] = {}
        self._by_client: dict[str, str] = {}
        """A PD prefill's client-given `request_id` -> this engine's id for it (while held)."""
        self._given_up: dict[str, float] = {}
        """Ids released before this engine held their KV (the client left mid-prefill): freed
        as soon as the prefill ends. Kept kv_hold_s at most, GIVEN_UP_MAX of them."""

    # lifecycle
    async def start(self) -> None:
        self.wall0 = time.monotonic()
        self.server = await serve(self.handle, self.id.host, self.port)
        self.port = self.server.sockets[0].getsockname()[1]
        self._driver = asyncio.get_running_loop().create_task(self._drive())

    async def stop(self) -> None:
        if self._driver is not None:
            self._driver.cancel()
        if self.server is not None:
            self.server.close()

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

    def _emit(self, result: StepResult) -> None:
        self.steps.append({"start_s": result.start_s, "duration_s": result.duration_s,
                           "prefill_tokens": result.prefill_tokens, "decode_seqs": result.decode_seqs})
        end = result.start_s + result.duration_s
        if result.preempted:
            self.metrics.c_preempt.inc(len(result.preempted))
        finished = set(result.finished)
        for rid in result.tokens:
            live = self.live.get(rid)
            if live is None:
                continue
            if live.first_v is None:
                live.first_v = end
                self.metrics.c_ttft.observe(end - live.arrival_v)
            else:
                gap = end - (live.last_v or end)
                self.metrics.c_itl.observe(gap)
                self.metrics.c_tpot.observe(gap)
            live.last_v = end
            live.emitted += 1
            self.metrics.c_gen.inc()
            live.queue.put_nowait((live.text.next(), "length" if rid in finished else None))
            self.faults.count_token()
        self.metrics.state(self.core.num_running, self.core.num_waiting, self.core.kv_usage)

    def _expire_held(self) -> bool:
        """Free the KV no decode claimed in time; True when anything was freed."""
        now = time.monotonic()
        freed = False
        for rid, at in list(self._held_at.items()):
            if now - at > self.id.kv_hold_s:
                freed = self.core.release(rid) or freed
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
        route = (request.method, request.path)
        try:
            if route == ("POST", "/v1/chat/completions"):
                await self._generate(request, response, "chat")
            elif route == ("POST", "/v1/completions"):
                await self._generate(request, response, "completion")
            elif route == ("GET", "/v1/models"):
                response.send(200, wire.models_body([self.id.served_model]))
            elif route == ("GET", "/health"):
                response.send(200, b"")
            elif route == ("GET", "/metrics"):
                self.metrics.state(self.core.num_running, self.core.num_waiting, self.core.kv_usage)
                response.send(200, self.metrics.render(), "text/plain; version=0.0.4; charset=utf-8")
            elif route == ("POST", "/internal/kv/release"):
                self._release(request, response)
            elif request.path == "/admin/faults" and request.method in ("GET", "POST"):
                self._faults(request, response)
            elif route == ("GET", "/admin/steps"):
                response.send(200, json.dumps(list(self.steps)).encode())
            else:
                raise wire.ApiError(404, f"no route {request.method} {request.path}", "not_found_error")
        except wire.ApiError as err:
            if not response.started:
                response.send(err.status, err.body())

    def _faults(self, request: Request, response: Responder) -> None:
        if request.method == "POST":
            try:
                self.faults.apply(json.loads(request.body or b"{}"), self)
            except (ValueError, TypeError) as err:
                raise wire.ApiError(400, f"bad fault: {err}") from None
        response.send(200, json.dumps(self.faults.describe()).encode())

    def _release(self, request: Request, response: Responder) -> None:
        try:
            body = json.loads(request.body)
            rid = str(body["request_id"])
        except (ValueError, KeyError, TypeError):
            raise wire.ApiError(400, "release wants {\"request_id\": ...}") from None
        if body.get("engine_id") not in (None, self.id.engine_id):
            raise wire.ApiError(404, f"engine {self.id.engine_id} holds no KV for request {rid}", "not_found_error")
        own = rid if rid in self.core.held else self._by_client.pop(rid, rid)
        if not self.core.release(own):
            if len(self._given_up) < GIVEN_UP_MAX:
                self._given_up[rid] = time.monotonic()  # if its prefill is still running: free it when done
            raise wire.ApiError(404, f"engine {self.id.engine_id} holds no KV for request {rid}", "not_found_error")
        self._held_at.pop(own, None)
        self.wake.set()  # blocks freed: a waiting request may fit now
        response.send(200, json.dumps({"released": rid}).encode())

    async def _generate(self, request: Request, response: Responder, kind: str) -> None:
        if self.faults.fail_status:
            raise wire.ApiError(self.faults.fail_status, "injected failure (admin fault fail_requests)",
                                "server_error")
        max_len = self.config.model.max_context
        req = wire.parse_generation(request.body, kind, max_len)
        if req.model != self.id.served_model:
            raise wire.ApiError(404, f"The model `{req.model}` does not exist.", "NotFoundError", "model")
        rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{self.id.engine_id}-{next(self._ids)}"
        prompt_tokens = req.prompt_tokens
        if prompt_tokens + req.max_tokens > max_len:
            raise wire.ApiError(400, f"prompt ({prompt_tokens} tokens) plus max_tokens ({req.max_tokens}) exceeds "
                                     f"the model's context of {max_len} tokens", param="max_tokens")
        live = _Live(req=req, rid=rid, prompt_tokens=prompt_tokens, text=TokenText(seed_for(req.seed, rid
                     if req.seed is not None else req.prompt_text + str(req.request_id or ""))))
        ready_after, remote_prefill = 0.0, False
        if pd.wants_remote_prefill(req.kv_transfer_params):
            ready_after, remote_prefill = await self._claim(req, prompt_tokens, live)
        hold = pd.wants_remote_decode(req.kv_transfer_params)
        if not self.core.has_work():
            self.core.advance_to(self.virtual_now())  # it sat idle: catch virtual time up
        try:
            self.core.add(rid, prompt_tokens, req.max_tokens, req.priority, ready_after, remote_prefill, hold)
        except ValueError as err:
            raise wire.ApiError(400, str(err), param="max_tokens") from None
        # arrival on the virtual clock: while a step runs, core.now is already that step's end
        live.arrival_v = min(self.core.now, self.virtual_now())
        self.live[rid] = live
        self.metrics.c_prompt.inc(prompt_tokens)
        self.wake.set()
        log.debug("request %s: %d prompt tokens, max_tokens %d, priority %d", rid, prompt_tokens, req.max_tokens,
                  req.priority)
        try:
            if req.stream:
                await self._stream(live, response)
            else:
                await self._complete(live, response)
        finally:
            self.live.pop(rid, None)
            if hold and live.emitted >= req.max_tokens:
                if self._given_up.pop(rid, None) is not None or (
                        req.request_id is not None and self._given_up.pop(req.request_id, None) is not None):
                    self.core.release(rid)  # released while it ran: nobody will claim it
                    self.wake.set()
                else:
                    self._held_at[rid] = time.monotonic()
                    if req.request_id is not None:
                        self._by_client[req.request_id] = rid
            elif live.emitted < req.max_tokens:
                self.core.abort(rid)  # client gone or engine failing: free its blocks
                self.wake.set()

    async def _claim(self, req: wire.GenerationRequest, prompt_tokens: int, live: _Live) -> tuple[float, bool]:
        params = req.kv_transfer_params or {}
        pd.check_decode_params(params)
        from pools.engine.claim import claim_blocks

        await claim_blocks(params)
        src = params.get("isle_placement")
        source = pd.Placement(node=src["node"], gpus=tuple(src["gpus"])) if isinstance(src, dict) else None
        ms, via = pd.transfer_ms(self.config.model, prompt_tokens, self.id.topology, source, self.id.placement,
                                 self.config.link)
        live.kv_ms = ms
        log.debug("KV of %d tokens from %s: %.2f ms over %s", prompt_tokens, params["remote_engine_id"], ms, via)
        return ms / 1000.0, True

    def _timing(self, live: _Live) -> dict[str, float]:
        ttft = (live.first_v - live.arrival_v) * 1000 if live.first_v is not None else 0.0
        tpot = ((live.last_v or 0) - (live.first_v or 0)) * 1000 / max(1, live.emitted - 1)
        return {"ttft_ms": round(ttft, 3), "tpot_ms": round(tpot, 3), "kv_transfer_ms": round(live.kv_ms, 3),
                "e2e_ms": round(((live.last_v or live.arrival_v) - live.arrival_v) * 1000, 3)}

    def _finish_metrics(self, live: _Live, reason: str) -> None:
        self.metrics.c_e2e.observe((live.last_v or live.arrival_v) - live.arrival_v)
        self.metrics.success.labels(self.id.served_model, reason).inc()

    def _extra(self, live: _Live) -> dict[str, Any]:
        extra: dict[str, Any] = {"isle_timing": self._timing(live)}
        if pd.wants_remote_decode(live.req.kv_transfer_params):
            extra["kv_transfer_params"] = pd.prefill_params(
                self.id.engine_id, live.rid, self.id.host, self.port, self.config.tp,
                -(-live.prompt_tokens // self.config.block_size), live.prompt_tokens, self.id.placement)
        return extra

    async def _complete(self, live: _Live, response: Responder) -> None:
        pieces, reason = [], "length"
        while True:
            piece, finish = await self._next_token(live)
            pieces.append(piece)
            if finish:
                reason = finish
                break
        self._finish_metrics(live, reason)
        body = wire.full_response(live.req, live.rid, "".join(pieces), reason, live.prompt_tokens, live.emitted,
                                  self._extra(live))
        response.send(200, json.dumps(body).encode())

    async def _next_token(self, live: _Live) -> tuple[str, str | None]:
        piece, finish = await live.queue.get()
        self.faults.maybe_crash()
        return piece, finish

    async def _stream(self, live: _Live, response: Responder) -> None:
        created = int(time.time())
        writer = wire.ChunkWriter(live.req, live.rid, created)
        response.start_stream()
        first = True
        while True:
            piece, finish = await self._next_token(live)
            await response.write(writer.content(piece, first))
            first = False
            if finish:
                await response.write(writer.finish(finish))
                break
        self._finish_metrics(live, "length")
        if live.req.include_usage:
            body = wire.usage_chunk(live.req, live.rid, created, live.prompt_tokens, live.emitted)
            extra = json.loads(body[6:])
            extra.update(self._extra(live))
            await response.write(wire.sse(extra))
        await response.write(wire.DONE)
        response.end()
