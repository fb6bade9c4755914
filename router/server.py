"""The router's data plane: one asyncio HTTP server (wire.http) that authenticates, admits
by SLO class, routes (pure decisions), orchestrates PD, proxies with retries before the first
byte, and records per-tier latency. The same code runs in tests, standalone and under Ray Serve.

The `Router` owns the parts and wires them; the request path below it sees only narrow seams:
a request becomes a `router.call.Call` (pure), a decision comes from `router.decision` (pure),
and a `router.flight.Flight` (or `router.pd.serve_pd`) carries it out through a
`FlightContext` (replica table, relay, metrics, upstream settings, clock, end callback).
Nothing below imports this module.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import os
import random
import time
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import Any

import orjson

from pools.autoscale.report import LoadReport, PoolLoad
from pools.model import SLOClass
from pools.routing import RoutingTable
from router import routes, targets
from router.admission import Admission
from router.auth import Auth
from router.call import Call, read_call
from router.config import RouterConfig
from router.contact import ControllerContact, Silence, router_health
from router.decision import RouteDecision, decide
from router.flight import Clock, Flight, FlightContext, fly
from router.kvindex import CacheView, KvIndex
from router.kvwatch import KvWatch
from router.lora import manager as lora
from router.metrics import BUCKETS, RouterMetrics
from router.pd import holding_roles, pd_choice, serve_pd
from router.plugins.filters import class_servable
from router.plugins.model import Candidate
from router.plugins.pd import PDDecision
from router.plugins.profile import Profile, check_profile
from router.plugins.timing import PluginTimer
from router.quota import Quotas
from router.relay import RelayPool
from router.routes import send_error
from router.state import Replicas
from router.upstream import Pool
from router.workers import Siblings, Workers, read_silence, read_view, socket_path, view_bytes
from topology import Topology
from wire import openai as wire
from wire.errors import ApiError
from wire.http import serve
from wire.reader import Request
from wire.responder import Responder

log = logging.getLogger("isleserve.router")
GENERATE_PATHS = frozenset(("/v1/chat/completions", "/v1/completions", "/v1/responses"))
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Router:
    def __init__(self, config: RouterConfig, table: RoutingTable, topology: Topology | None = None,
                 plan: Mapping[str, Any] | None = None, worker: int = 0, clock: Clock = time.perf_counter) -> None:
        """`clock`: the request path's clock (seconds, monotonic): latencies, deadlines, backoff."""
        self.config = config
        self.clock = clock
        self.worker = worker
        """This process's index among the router's workers (0: the leader, which starts the others)."""
        self.auth = Auth(config)
        self.replicas = Replicas(table, config.upstream.breaker_failures, config.upstream.breaker_open_s,
                                 config.fair.replica_max_num_seqs)
        self.replicas.kv_watch = KvWatch(config.pd.kv_path.rules(), config.pd.kv_path.max_pairs)
        self.topology = topology
        self.plan = plan
        self.contact: ControllerContact | None = None
        """The leader's contact with its controller (isleserve.app); None: a standalone router."""
        self.silence: Silence | None = None
        """The controller's silence as the leader last pushed it (every worker)."""
        self.metrics = RouterMetrics()
        self.admission = Admission(config.classes(), share=config.workers)
        self.metrics.inflight = self.admission.inflight
        tenants, anyone = config.quotas()
        self.quotas = Quotas(tenants, anyone, config.fair.class_quotas(), time.monotonic, share=config.workers)
        self.cost_limits = config.fair.cost_limits(config.max_tokens_limit)
        self.seq_shares = config.fair.shares(config.classes())
        self.plugin_timer = PluginTimer(self.metrics.plugins, clock)
        engine_key = config.upstream.engine_key()
        self.pool = Pool(config.upstream.connect_timeout_s, key=engine_key)  # scraping engines' /metrics
        self.relay = RelayPool(config.upstream.connect_timeout_s, engine_key=engine_key)  # the request path
        self.keyless = routes.KeylessBudget(config.tokenize_open_bytes_per_s)
        self.flights = FlightContext(self.replicas, self.relay, self.metrics, config.upstream, self.request_ended,
                                     clock, self._reroute)
        self.rng = random.Random(config.seed)
        self.turns = itertools.count()
        self.profiles = {name: self._profile(name) for name in config.classes()}
        self.kv_scored = {name: "kv-cache-scorer" in p.scorers for name, p in self.profiles.items()}
        """Classes whose profile weighs the engines' caches (`isle_router_prefix_fallbacks`)."""
        self.openapi = routes.ServedDocument(list(config.classes()), config.max_tokens_limit,
                                             config.tokenize_auth == "key")
        self.server: asyncio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        events = config.kv_events
        self.kvindex = KvIndex(events.endpoint, events.block_size, tokenize_timeout_s=events.tokenize_timeout_s,
                               tokenize_cache=events.tokenize_cache,
                               pool=Pool(config.upstream.connect_timeout_s, events.tokenize_timeout_s, engine_key)
                               ) if events is not None else None
        """The engines' prefix caches from their KV events (config `kv_events`; one worker)."""
        if self.kvindex is not None:
            self.kvindex.follow(table.replicas)
            self.metrics.kv_index = self.kvindex.view
        self.metrics.kv_paths = lambda: self.replicas.kv_watch.view(time.monotonic()) if self.replicas.kv_watch else {}
        self.siblings: Siblings | None = None
        self.workers: Workers | None = None
        """The leader's other workers (config `workers` > 1)."""
        self._internal: asyncio.Server | None = None
        self.limits = config.limits()
        self.metrics.front_door = self.limits.view
        self._background: set[asyncio.Task[None]] = set()
        self._ids = itertools.count()
        self._id_prefix = f"isle-{os.getpid():x}-{worker}-{int(time.time() * 1000):x}"
        self.loras = lora.LoraManager(config.lora, self.metrics, engine_key) if config.lora is not None else None
        """LoRA adapters routed like models (config `lora`; `router.lora`)."""

    def request_id(self) -> str:
        """An id the router gives an engine request (unique across processes and restarts)."""
        return f"{self._id_prefix}-{next(self._ids)}"

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run clean-up work apart from the request that needed it (which may be cancelled)."""
        self._task(work)

    def _task(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """`work` apart from the request that started it; cancelled when the router stops."""
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def _profile(self, slo_class: str) -> Profile:
        p = self.config.profile(slo_class)
        profile = Profile(filters=tuple(p.filters), scorers=dict(p.scorers), picker=p.picker)
        check_profile(profile)
        return profile

    async def start(self) -> None:
        self.server = await serve(self.handle, self.config.host, self.config.port,
                                  on_error=lambda e: log.exception("handler error", exc_info=e),
                                  read_timeout_s=self.config.read_timeout_s, max_body_bytes=self.config.max_body_bytes,
                                  reuse_port=self.config.workers > 1, limits=self.limits,
                                  head_check=self.head_check, clock=self.clock)
        log.info("front door: %s", self.limits.describe())
        self._tasks.append(asyncio.get_running_loop().create_task(
            self.replicas.scrape_forever(self.pool, self.config.scrape_interval_s, self._publish_health)))
        if self.loras is not None:
            self._tasks.append(asyncio.get_running_loop().create_task(self.loras.refresh_forever(
                self.replicas.snapshot)))
        if self.kvindex is not None:
            self.kvindex.start()
        if self.worker == 0 and self.config.workers > 1:  # the leader starts the others on the port it got
            self.workers = Workers(self.config.model_copy(update={"port": self.port}).model_dump_json(),
                                   self.config.workers)
            await self.join(self.workers.directory)
            try:
                await self.workers.start(self.view())
            except BaseException:
                await self.stop()
                raise

    async def join(self, directory: Path) -> None:
        """Listen for the sibling workers on `directory`/INDEX.sock."""
        from wire.http import serve_unix

        self._internal = await serve_unix(self.internal, socket_path(directory, self.worker),
                                          on_error=lambda e: log.exception("internal handler error", exc_info=e))
        self.siblings = Siblings(directory, self.worker, self.config.workers)

    def view(self) -> bytes:
        return view_bytes(self.replicas.table, self.topology, self.plan, self.silence)

    async def set_view(self, table: RoutingTable, topology: Topology | None, plan: Mapping[str, Any] | None) -> None:
        """A newer routing table (with the topology and plan it was made for), in every worker."""
        if not table.supersedes(self.replicas.table):
            return
        self.topology, self.plan = topology, plan
        self.replicas.follow(table)
        if self.kvindex is not None:
            self.kvindex.follow(table.replicas)
        if self.workers is not None:
            await self.workers.push(self.view())

    async def set_silence(self, silence: Silence | None) -> None:
        """Whether the leader hears from its controller, in every worker (pushed when it changes)."""
        if silence == self.silence:
            return
        self.silence = silence
        if self.workers is not None:
            await self.workers.push(self.view())

    def _keyed(self, request: Request) -> bool:
        """The caller sent a valid user key (the open token routes count only keyless bytes)."""
        try:
            self.auth.user(request.headers)
        except ApiError:
            return False
        return True

    def controller_health(self) -> Mapping[str, Any]:
        """The last plan's word, "degraded" too while the controller does not answer."""
        return router_health(routes.controller_health(self.plan), self.contact, self.silence)

    def internal(self, request: Request, response: Responder) -> Coroutine[Any, Any, None] | None:
        """The sibling workers' routes (Unix socket only)."""
        if (request.method, request.path) == ("GET", "/internal/metrics"):
            response.send(200, orjson.dumps(self.metrics.snapshot()))
        elif (request.method, request.path) == ("PUT", "/internal/view"):
            table, topology, plan = read_view(request.body)
            if table.supersedes(self.replicas.table):
                self.topology, self.plan = topology, plan
                self.replicas.follow(table)
            self.silence = read_silence(request.body)
            response.send(200, b"{}")
        else:
            send_error(response, ApiError(404, f"no route {request.method} {request.path}", "not_found_error"))
        return None

    async def _metrics(self, response: Responder) -> None:
        assert self.siblings is not None
        peers = await self.siblings.snapshots()
        response.send(200, self.metrics.render(peers), METRICS_TYPE)

    async def load_report(self) -> LoadReport:
        """What the controller's autoscaler reads (`pools.autoscale.report`): per pool, the engines'
        load as this worker last scraped it, the requests in flight per replica (this worker's),
        and every worker's request counts and TTFT/TPOT histograms (cumulative, by class); and
        this worker's KV-path verdicts for the controller's `kv_path` events (`control.kvpaths`)."""
        peers = await self.siblings.snapshots() if self.siblings is not None else []
        m = self.metrics
        gauges: dict[str, list[float]] = {}
        inflight: dict[str, dict[str, int]] = {}
        for state in self.replicas.states.values():
            ep = state.endpoint
            g = gauges.setdefault(ep.pool, [0.0, 0.0])
            g[0] += state.running
            g[1] += state.waiting
            key = ep.gang or ep.replica_id  # a gang's ranks count as the one replica they are
            mine = inflight.setdefault(ep.pool, {})
            mine[key] = mine.get(key, 0) + state.inflight
        sent = {pool: int(c.value) for (pool,), c in m.sent.merged(
            [x["families"].get(m.sent.name, []) for x in peers]).items()}
        pools = {pool: PoolLoad(running=gauges.get(pool, [0.0, 0.0])[0], waiting=gauges.get(pool, [0.0, 0.0])[1],
                                sent=sent.get(pool, 0), inflight=inflight.get(pool, {}))
                 for pool in (*gauges, *(p for p in sent if p not in gauges))}
        series: dict[str, dict[tuple[str, str], tuple[int, ...]]] = {}
        for key, family in (("ttft", m.ttft), ("tpot", m.tpot)):
            summed: dict[tuple[str, str], list[int]] = {}
            for (cls, pool, _tier), h in family.merged([x["families"].get(family.name, []) for x in peers]).items():
                counts = summed.setdefault((cls, pool), [0] * len(h.counts))
                summed[(cls, pool)] = [a + b for a, b in zip(counts, h.counts, strict=True)]
            series[key] = {k: tuple(v) for k, v in summed.items()}
        kv_paths = self.replicas.kv_watch.verdicts(time.monotonic()) if self.replicas.kv_watch is not None else ()
        return LoadReport(buckets=tuple(BUCKETS), pools=pools, ttft=series["ttft"], tpot=series["tpot"],
                          kv_paths=kv_paths)

    def _publish_health(self) -> None:
        self.metrics.healthy = {c.endpoint.replica_id: 1.0 if c.endpoint.healthy and not c.load.breaker_open else 0.0
                                for c in self.replicas.snapshot()}  # replicas that left the table leave the gauge

    async def stop(self) -> None:
        tasks = [*self._tasks, *self._background]
        for t in tasks:
            t.cancel()
        if tasks:  # each ends where it was (a scrape, a LoRA refresh) before what it uses closes
            await asyncio.wait(tasks, timeout=5.0)
        if self.kvindex is not None:
            await self.kvindex.stop()
        if self.server is not None:
            self.server.close()
        if self.workers is not None:
            await self.workers.stop()
            self.workers = None
        if self._internal is not None:
            self._internal.close()
        self.pool.close()
        self.relay.close()
        self.flights.watch.close()

    @property
    def port(self) -> int:
        assert self.server is not None
        server: Any = self.server  # `sockets`: a tuple in typeshed, a list under uvloop; compiled code checks
        return int(server.sockets[0].getsockname()[1])

    # routes. `handle` is synchronous: most requests finish through the upstream connection's
    # callbacks (router.flight); it returns a coroutine only for work that must wait.
    def handle(self, request: Request, response: Responder) -> Coroutine[Any, Any, None] | None:
        method, path = request.method, request.path
        if method == "HEAD":
            method = "GET"  # the responder sends the head only
        try:
            if method == "POST" and path in GENERATE_PATHS:
                return self._generate(request, response)
            wrong = routes.wrong_method(request.method, path)
            if wrong is not None:
                raise wrong
            if method == "POST" and path in routes.TOKEN_PATHS:
                if self.config.tokenize_auth == "key":
                    self.auth.user(request.headers)
                    return routes.forward(self.flights, request, response)
                return routes.forward(self.flights, request, response, None if self._keyed(request) else
                                      self.keyless)
            if method == "GET" and path.startswith(routes.MODELS_PREFIX):
                self.auth.user(request.headers)
                card = lora.card_body(self.loras, path)  # an adapter's, else a model's
                response.send(200, card or routes.model_body(self.replicas.table.models(), path, self.replicas.largest))
            elif (method, path) == ("GET", "/v1/models"):
                self.auth.user(request.headers)
                response.send(200, wire.models_body(self.replicas.table.models(), contexts=self.replicas.largest,
                                                    cards=self.loras.cards() if self.loras is not None else ()))
            elif (method, path) == ("GET", "/health"):
                response.send(200, routes.health_body(len(self.replicas.table.replicas), self.plan,
                                                      self.controller_health()))
            elif (method, path) == ("GET", "/metrics"):
                self.metrics.controller = self.controller_health()
                if self.config.metrics_auth == "admin":
                    self.auth.admin(request.headers)
                if self.siblings is not None:
                    return self._metrics(response)
                response.send(200, self.metrics.render(), METRICS_TYPE)
            elif (method, path) == ("GET", "/openapi.json"):
                response.send(200, self.openapi.document(self.replicas.largest))
            elif (method, path) == ("GET", targets.PATH):
                self.auth.admin(request.headers)
                address = targets.router_address(self.config.host, self.port, request.headers)
                response.send(200, targets.targets_body(self.replicas.table, address))
            elif path in lora.ADMIN_PATHS:
                self.auth.admin(request.headers)
                return self._lora_admin(request, response)
            elif path.startswith("/admin/") and method == "GET":
                self.auth.admin(request.headers)
                view = routes.admin_view(path, self.replicas, self.worker, self.topology, self.plan,
                                         self.kvindex.per_replica() if self.kvindex is not None else None)
                response.send(200, json.dumps(view).encode())
            else:
                raise ApiError(404, f"no route {method} {path}", "not_found_error")
        except ApiError as err:
            send_error(response, err)
        return None

    def head_check(self, head: Request) -> tuple[int, bytes] | None:
        """A request that carries a body needs a valid key before any of its body is buffered (no
        route open without a key takes a body, but vLLM's token routes): without one, its body
        is read and dropped and 401 is its answer (`wire.reader.HeadCheck`), so no one without a key can fill the
        buffered-bytes cap (`/tokenize` and `/detokenize` are open as on vLLM unless
        `tokenize_auth: key`: their bodies count against the caps like any other). The rest is
        `handle`'s, as before."""
        headers = head.headers
        if self.auth.open or ("transfer-encoding" not in headers
                              and not headers.get("content-length", "").strip().strip("0")):
            return None
        if head.path in routes.TOKEN_PATHS and self.config.tokenize_auth == "vllm":
            return None  # open, as on vLLM (`tokenize_auth`)
        try:
            self.auth.user(headers)
        except ApiError as err:
            self.refused(None, err)
            return err.status, err.body()
        return None

    # generation
    def _parse(self, request: Request, slo: SLOClass, tenant: str) -> Call:
        c = self.config
        return read_call(request.body, request.path, slo, max_body_bytes=c.max_body_bytes,
                         max_tokens_limit=c.max_tokens_limit, mixed=self.replicas.mixed_for(slo.name),
                         limits=self.cost_limits, seq_share=self.seq_shares[slo.name],
                         declared=self.replicas.declared, tenant=tenant, contexts=self.replicas.contexts,
                         largest=self.replicas.largest, adapters=self.loras.bases() if self.loras is not None else None)

    def _with_cached(self, call: Call, view: CacheView) -> Call:
        """The request with what each of its model's replicas holds of its prompt (`router.kvindex`),
        and the topology a pull between them is priced over (`router.plugins.pull`)."""
        return dataclasses.replace(call, route=call.route._replace(cacheable_tokens=view.cacheable_tokens,
                                                                   cached=view.held, topology=self.topology),
                                   kv_prompt_tokens=view.prompt_tokens)

    def _generate(self, request: Request, response: Responder) -> Coroutine[Any, Any, None] | None:
        slo: SLOClass | None = None
        try:
            principal = self.auth.user(request.headers)
            slo = self.auth.slo_class(principal, request.headers.get("x-slo-class"))
            call = self._parse(request, slo, principal.tenant)
            if call.route.model not in self.replicas.served:
                raise ApiError(404, f"The model `{call.route.model}` does not exist.", "NotFoundError", "model",
                                    cause="unknown_model")
            started = request.arrived or self.clock()  # TTFT and E2E count from the request's first byte
            snapshot = self.replicas.snapshot()
            mixed = self._class_pools(call, snapshot)
            self.admission.check_overload(slo, snapshot)
            roles = holding_roles(self.config.pd, call, mixed)
            self.admission.check_headroom(call.route, snapshot, roles)
            if self.kvindex is not None:  # after the checks that refuse cheaply
                view = self.kvindex.request(call.route.model, call.body, call.path, call.prompt_key,
                                            self.replicas.table.replicas, call.lora)
                if not isinstance(view, CacheView):  # a vLLM replica's tokenizer first: the request waits
                    return self._after_tokens(view, call, response, started, mixed)
                call = self._with_cached(call, view)
        except ApiError as err:
            self.refused(slo, err)
            raise
        if not self._admit(call):
            return self._waiting(call, response, started, queued=True)
        try:
            if call.lora and self.loras is not None and self.loras.needs_load(call.lora, snapshot,
                                                                               call.slo.sheddable):
                return self._waiting(call, response, started)  # its adapter is loaded first (`_serve`)
            pd = self._pd_choice(call, snapshot, mixed)
            if pd is not None:
                return self._waiting(call, response, started, pd=pd)
            decision = self._decide(call, snapshot)
            if decision.winner is None and self._table_wait_s() > 0:
                return self._waiting(call, response, started)  # for the next table (`_serve`)
            flight = Flight(self.flights, call, decision.order(), response, started, call.payload, owner=True)
        except BaseException:
            self.request_ended(call, "error")
            raise
        response.on_disconnect(flight.abandon)
        flight.begin()
        return None

    def _admit(self, call: Call) -> bool:
        """Its quota and an admission slot (False: it waits for one); refused and counted when over."""
        try:
            self.quotas.enter(call.tenant, call.slo.name, call.cost.tokens if call.cost is not None else 0)
            try:
                return self.admission.enter(call.slo)
            except ApiError:
                self.quotas.leave(call.tenant)
                raise
        except ApiError as err:
            self.refused(call.slo, err)
            raise

    async def _after_tokens(self, view: Coroutine[Any, Any, CacheView], call: Call, response: Responder,
                            started: float, mixed: frozenset[str]) -> None:
        """`_generate`'s rest for a request whose prompt a vLLM replica tokenized for the index first
        (`router.kvindex`): on the coroutine path (`_waiting`), from a fresh snapshot."""
        call = self._with_cached(call, await view)
        try:
            admitted = self._admit(call)
        except ApiError as err:
            send_error(response, err)
            return
        pd = None
        if admitted:
            try:
                pd = self._pd_choice(call, self.replicas.snapshot(), mixed)
            except BaseException:
                self.request_ended(call, "error")
                raise
        await self._waiting(call, response, started, queued=not admitted, pd=pd)

    def request_ended(self, call: Call, outcome: str) -> None:
        self.admission.leave(call.slo)
        self.quotas.leave(call.tenant)
        self.metrics.child(self.metrics.requests, call.slo.name, outcome).inc()

    def refused(self, slo: SLOClass | None, err: ApiError) -> None:
        """A request the router answered itself with `err` before any engine saw it: counted once,
        as `shed` (429) or `rejected`, with its cause."""
        m = self.metrics
        cause = err.cause or routes.REFUSALS.get(err.status, f"status_{err.status}")
        m.child(m.rejections, slo.name if slo is not None else "unknown", cause).inc()
        if slo is not None:
            m.child(m.requests, slo.name, "shed" if err.status == 429 else "rejected").inc()

    def _pd_choice(self, call: Call, snapshot: list[Candidate], mixed: frozenset[str]) -> PDDecision | None:
        timed = self.metrics.child(self.metrics.decision, "pd").observe
        pd = pd_choice(self.config.pd, call, snapshot, self.topology, mixed, self.plugin_timer, timed, self.clock,
                       self.replicas.kv_watch)
        if pd is not None:
            self._prefix_seen(call, pd.prefill)
        return pd

    def _class_pools(self, call: Call, snapshot: list[Candidate]) -> frozenset[str]:
        """The models whose mixed replicas may serve the call. Its class keeps to the pools declared
        for it while one of their mixed or decode replicas can take it; when none can (crashed,
        breaker open, lost with their node), the call may use every pool of its model
        (`RouteRequest.any_pool`), as it would if no pool were declared for its class: a declared
        pool that is down degrades to routing by load instead of failing every request of the
        class until it is back (counted as `isle_router_class_fallbacks_total`)."""
        route = call.route
        if route.any_pool:
            return self.replicas.mixed
        if class_servable(route, snapshot):
            return self.replicas.mixed_for(call.slo.name)
        call.route = route._replace(any_pool=True)
        self.metrics.child(self.metrics.fallbacks, call.slo.name).inc()
        return self.replicas.mixed

    def _decide(self, call: Call, snapshot: list[Candidate]) -> RouteDecision:
        """The replicas to try, best first. A class kept to its own pools that find no replica here
        (its mixed pools none, its PD pair not whole at this instant: a prefill or decode just
        crashed) is served by the other pools rather than refused (`_class_pools`)."""
        t0 = self.clock()
        if call.lora and self.loras is not None:  # an adapter's requests go where it is loaded
            snapshot = self.loras.holders(call.lora, snapshot)
        profile = self.profiles[call.slo.name]
        decision = decide(call.route, snapshot, profile, self.rng, next(self.turns), self.plugin_timer)
        if decision.winner is None and not call.route.any_pool:
            call.route = call.route._replace(any_pool=True)
            self.metrics.child(self.metrics.fallbacks, call.slo.name).inc()
            decision = decide(call.route, snapshot, profile, self.rng, next(self.turns), self.plugin_timer)
        self.metrics.child(self.metrics.decision, "replica").observe(self.clock() - t0)
        if decision.winner is not None:
            self._prefix_seen(call, decision.winner)
            if call.lora and self.loras is not None:
                self.loras.used(call.lora, decision.winner.endpoint.replica_id)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(decision.log_line())
        return decision

    def _prefix_seen(self, call: Call, chosen: Candidate) -> None:
        """What the chosen replica's cache held of the prompt (`isle_router_prefix_*`; with kv_events)."""
        route = call.route
        if self.kvindex is None or call.kv_prompt_tokens <= 0:
            if self.kv_scored.get(call.slo.name):
                reason = "no_index" if self.kvindex is None else "unkeyed"
                self.metrics.child(self.metrics.prefix_fallbacks, chosen.endpoint.pool, call.slo.name, reason).inc()
            return
        bs, m = self.kvindex.block_size, self.metrics
        labels = (chosen.endpoint.pool, call.slo.name)
        hit = route.cached.get(chosen.endpoint.replica_id, 0)
        self.kvindex.served(chosen.endpoint.replica_id, hit, call.kv_prompt_tokens)
        m.child(m.prefix_hit_tokens, *labels).inc(hit)  # as the engine will count them (vllm:prefix_cache_*)
        m.child(m.prefix_query_tokens, *labels).inc(call.kv_prompt_tokens)
        if route.cacheable_tokens > 0:
            m.child(m.prefix_hit_blocks, *labels).inc(hit // bs)
            m.child(m.prefix_query_blocks, *labels).inc(route.cacheable_tokens // bs)
            m.child(m.prefix_hit_ratio, *labels).observe(hit / route.cacheable_tokens)

    async def _waiting(self, call: Call, response: Responder, started: float, queued: bool = False,
                       pd: PDDecision | None = None, refused: ApiError | None = None) -> None:
        """The coroutine path: a request queued for an admission slot, a PD request, or one whose
        replicas all refused the connection (`refused`, their 502: it waits for the next table first)."""
        slo = call.slo
        if queued:
            try:
                await self.admission.wait(slo)
            except ApiError as err:
                self.quotas.leave(call.tenant)
                self.refused(slo, err)
                send_error(response, err)
                return
            except asyncio.CancelledError:
                self.quotas.leave(call.tenant)
                raise
            if pd is None:
                snapshot = self.replicas.snapshot()
                pd = self._pd_choice(call, snapshot, self._class_pools(call, snapshot))
        outcome = "error"
        try:
            outcome = await self._serve(call, pd, response, started, refused)
        except asyncio.CancelledError:
            outcome = "client_timeout" if response.timed_out else "cancelled"
            raise
        except ApiError as err:
            outcome = "rejected" if err.status < 500 else "error"
            send_error(response, err)
        finally:
            self.request_ended(call, outcome)

    async def _lora_admin(self, request: Request, response: Responder) -> None:
        try:
            found = await lora.admin(self.loras, request.method, request.path, request.body, self.replicas.snapshot,
                                     self.replicas.table.models())
            response.send(200, orjson.dumps(found))
        except ApiError as err:
            send_error(response, err)

    def _reroute(self, call: Call, response: Responder, started: float, refused: ApiError) -> bool:
        """A request every replica it was sent to refused at connect (`Flight.reached`; `refused`:
        the 502 it got): under a controller it waits for the next table like one nothing in the view
        can take (`_serve`), its admission slot and answer now this coroutine's; False without one
        (answered the 502 now)."""
        if self._table_wait_s() <= 0:
            return False
        task = self._task(self._rerouted(call, response, started, refused))

        def gone() -> None:  # the client went away: stop its wait and what it started
            task.cancel()

        response.on_disconnect(gone)
        return True

    async def _rerouted(self, call: Call, response: Responder, started: float, refused: ApiError) -> None:
        try:
            await self._waiting(call, response, started, refused=refused)
        except Exception:  # no connection's task runs it (`wire.http`): the client still gets an answer
            log.exception("a rerouted request failed")
            if not response.started:
                send_error(response, ApiError(500, "internal error", "server_error"))
            elif not response.finished:
                response.end()

    def _table_wait_s(self) -> float:
        """How long a request nothing in this view can take waits for a newer table: only under a
        controller (its tables carry an epoch; a static table never changes)."""
        return self.config.upstream.table_wait_s if self.replicas.table.epoch else 0.0

    async def _serve(self, call: Call, pd: PDDecision | None, response: Responder, started: float,
                     refused: ApiError | None = None) -> str:
        """The PD pair, else (or when it failed before the first byte) a mixed replica. When neither
        can take the request, or every mixed replica it was sent to refused the connection (no
        engine saw it: `Flight.reached`), this view is behind the cluster (the engines it lists were
        stopped by a scale-in it has not followed yet, the one left is not in it, or was restarted
        on another port): the request waits for the next table (`Replicas.newer`, up to
        `upstream.table_wait_s`) and is routed again on it, as Ray Serve's router waits for its
        replica set; then 503, or the pair's or the replicas' own error (a refused request's 502
        even once the refusing engine's breaker has opened). `refused`: its replicas already refused
        it with this 502; it starts with that wait."""
        loop = asyncio.get_running_loop()  # the wait's own clock (a test's request clock may stand still)
        until = loop.time() + self._table_wait_s()
        if refused is not None and until > loop.time():
            pd = await self._next_table(call, until - loop.time())
        while True:
            failed: ApiError | None = None
            if pd is not None:
                try:
                    return await serve_pd(self.flights, call, pd, response, started, self.request_id(), self.spawn)
                except ApiError as err:
                    if response.started or err.status < 500:
                        raise
                    failed = err
                    log.debug("PD pair %s/%s failed before the first byte (%s): a mixed replica serves it",
                              pd.prefill.endpoint.replica_id, pd.decode.endpoint.replica_id, err.message)
            if call.lora and self.loras is not None:
                await self.loras.ensure(call.lora, self.replicas.snapshot, call.slo.sheddable)
            decision = self._decide(call, self.replicas.snapshot())
            if decision.winner is None:
                if until > loop.time():
                    pd = await self._next_table(call, until - loop.time())  # then once more, on it
                    continue
                if failed is not None:
                    raise failed  # what the pair's engines said, not "no replica"
                if refused is not None:
                    raise refused  # what its replicas did (refuse it), not "no replica"
            flight = await fly(self.flights, call, decision.order(), response, started, call.payload)
            if flight.error is not None and not flight.reached and until > loop.time():
                refused = flight.error  # no engine saw it: route it again on the next table
                pd = await self._next_table(call, until - loop.time())
                continue
            return flight.outcome_or_raise()

    async def _next_table(self, call: Call, wait_s: float) -> PDDecision | None:
        """Wait up to `wait_s` for a newer table (`Replicas.newer`), then the request's PD pair on
        what it brought."""
        await self.replicas.newer(wait_s)
        snapshot = self.replicas.snapshot()
        return self._pd_choice(call, snapshot, self._class_pools(call, snapshot))
