"""The router's data plane: one asyncio HTTP server (wire.http) that authenticates, admits
by SLO class, routes (pure decisions), orchestrates PD, proxies with retries before the first
byte, and records per-tier latency. The same code runs in tests, standalone and under Ray Serve.

The `Router` owns the parts and wires them: the listener and its front door, the routes other
than generation (models, health, metrics, token routes, admin, the sibling workers' socket), the
replica table it follows and scrapes, and its lifecycle. Generation requests go to its
`router.generation.Generation`, whose request path sees only narrow seams: a request becomes a
`router.call.Call` (pure), a decision comes from `router.decision` (pure), and a
`router.flight.Flight` (or `router.pd.serve_pd`) carries it out through a `FlightContext`.
Nothing below imports this module.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import Any

import orjson

from pools.autoscale.report import LoadReport, PoolLoad
from pools.routing import RoutingTable
from router import routes, targets
from router.auth import Auth
from router.config import RouterConfig
from router.contact import ControllerContact, Silence, router_health
from router.flight import Clock
from router.generation import Generation
from router.kvindex import KvIndex
from router.kvwatch import KvWatch
from router.lora import manager as lora
from router.metrics import BUCKETS, RouterMetrics
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
        engine_key = config.upstream.engine_key()
        self.pool = Pool(config.upstream.connect_timeout_s, key=engine_key)  # scraping engines' /metrics
        self.relay = RelayPool(config.upstream.connect_timeout_s, engine_key=engine_key)  # the request path
        self.keyless = routes.KeylessBudget(config.tokenize_open_bytes_per_s)
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
        self.loras = lora.LoraManager(config.lora, self.metrics, engine_key) if config.lora is not None else None
        """LoRA adapters routed like models (config `lora`; `router.lora`)."""
        self.generation = Generation(config, clock, auth=self.auth, replicas=self.replicas, metrics=self.metrics,
                                     relay=self.relay, kvindex=self.kvindex, loras=self.loras,
                                     topology=lambda: self.topology,
                                     id_prefix=f"isle-{os.getpid():x}-{worker}-{int(time.time() * 1000):x}")
        """The generation routes' request path (`router.generation`)."""
        self.admission = self.generation.admission
        self.flights = self.generation.flights

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
        tasks = [*self._tasks, *self.generation.background]
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
        await self.pool.aclose()  # before the loop ends: a task left to close them later was cancelled with it
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
                return self.generation.generate(request, response)
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
            self.generation.refused(None, err)
            return err.status, err.body()
        return None













    async def _lora_admin(self, request: Request, response: Responder) -> None:
        try:
            found = await lora.admin(self.loras, request.method, request.path, request.body, self.replicas.snapshot,
                                     self.replicas.table.models())
            response.send(200, orjson.dumps(found))
        except ApiError as err:
            send_error(response, err)





