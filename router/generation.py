"""The generation request path (`/v1/chat/completions`, `/v1/completions`, `/v1/responses`).

A request is authenticated and classed, parsed into a `router.call.Call` (pure), held to its
tenant's quota and its class's admission slots, priced against the engines' prefix caches when
the router follows their KV events (`router.kvindex`), and routed: a prefill/decode pair
(`router.pd`), else the replicas best first (`router.decision`, pure). A `router.flight.Flight`
or `router.pd.serve_pd` carries it out through the `FlightContext` (replica table, relay,
metrics, upstream settings, clock, end callback). Under a controller, a request nothing in this
view can take, or that every replica it was sent to refused at connect, waits for the next
routing table and is routed again on it (`Generation._serve`).

`router.server.Router` owns one `Generation`, hands it the parts it shares with the other routes
(auth, the replica table, metrics, the relay, the prefix index, the LoRA adapters) and sends it
every generation request. Nothing here imports `router.server`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import random
import time
from collections.abc import Callable, Coroutine
from typing import Any

from pools.model import SLOClass
from router import routes
from router.admission import Admission
from router.auth import Auth
from router.call import Call, read_call
from router.config import RouterConfig
from router.decision import RouteDecision, decide
from router.flight import Clock, Flight, FlightContext, fly
from router.kvindex import CacheView, KvIndex
from router.lora.manager import LoraManager
from router.metrics import RouterMetrics
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
from topology import Topology
from wire.errors import ApiError
from wire.reader import Request
from wire.responder import Responder

log = logging.getLogger("isleserve.router")


class Generation:
    def __init__(self, config: RouterConfig, clock: Clock, *, auth: Auth, replicas: Replicas, metrics: RouterMetrics,
                 relay: RelayPool, kvindex: KvIndex | None, loras: LoraManager | None,
                 topology: Callable[[], Topology | None], id_prefix: str) -> None:
        """`topology`: the topology of the router's current view (it changes with the table)."""
        self.config = config
        self.clock = clock
        self.auth = auth
        self.replicas = replicas
        self.metrics = metrics
        self.kvindex = kvindex
        self.loras = loras
        self.topology = topology
        self.admission = Admission(config.classes(), share=config.workers)
        metrics.inflight = self.admission.inflight
        tenants, anyone = config.quotas()
        self.quotas = Quotas(tenants, anyone, config.fair.class_quotas(), time.monotonic, share=config.workers)
        self.cost_limits = config.fair.cost_limits(config.max_tokens_limit)
        self.seq_shares = config.fair.shares(config.classes())
        self.plugin_timer = PluginTimer(metrics.plugins, clock)
        self.flights = FlightContext(replicas, relay, metrics, config.upstream, self.request_ended, clock,
                                     self._reroute)
        self.rng = random.Random(config.seed)
        self.turns = itertools.count()
        self.profiles = {name: self._profile(name) for name in config.classes()}
        self.kv_scored = {name: "kv-cache-scorer" in p.scorers for name, p in self.profiles.items()}
        """Classes whose profile weighs the engines' caches (`isle_router_prefix_fallbacks`)."""
        self.background: set[asyncio.Task[None]] = set()
        """Work apart from the request that started it (`spawn`): cancelled when the router stops."""
        self._ids = itertools.count()
        self._id_prefix = id_prefix

    def request_id(self) -> str:
        """An id the router gives an engine request (unique across processes and restarts)."""
        return f"{self._id_prefix}-{next(self._ids)}"

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run clean-up work apart from the request that needed it (which may be cancelled)."""
        self._task(work)

    def _task(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """`work` apart from the request that started it; cancelled when the router stops."""
        task = asyncio.get_running_loop().create_task(work)
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        return task

    def _profile(self, slo_class: str) -> Profile:
        p = self.config.profile(slo_class)
        profile = Profile(filters=tuple(p.filters), scorers=dict(p.scorers), picker=p.picker)
        check_profile(profile)
        return profile

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
                                                                   cached=view.held, topology=self.topology()),
                                   kv_prompt_tokens=view.prompt_tokens)

    def generate(self, request: Request, response: Responder) -> Coroutine[Any, Any, None] | None:
        """A generation request (`Router.handle`): synchronous while it can be (most finish
        through the upstream connection's callbacks), a coroutine for one that must wait. A
        refusal raises its `ApiError` (counted here), which the caller answers."""
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
        pd = pd_choice(self.config.pd, call, snapshot, self.topology(), mixed, self.plugin_timer, timed, self.clock,
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
