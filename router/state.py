"""What the router knows about each replica right now: load scraped from the engine's /metrics
(vLLM's names), its own in-flight count and latency, and a circuit breaker; and, for a request
that nothing in this view can take, a wait for the next routing table (`newer`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from pools.routing import ReplicaEndpoint, RoutingTable
from router.kvwatch import KvWatch, nixl_totals
from router.plugins.model import Candidate, ReplicaLoad
from router.upstream import Pool, UpstreamError
from wire.promtext import engine_load


def parse_vllm_metrics(text: str) -> dict[str, float]:
    """`running`, `waiting` and `kv_usage`, those the engine's /metrics text has
    (wire.promtext.engine_load; ValueError: not Prometheus text)."""
    load = engine_load(text)
    found = (("running", load.running), ("waiting", load.waiting), ("kv_usage", load.kv_usage))
    return {name: value for name, value in found if value is not None}


@dataclass(slots=True)
class ReplicaState:
    endpoint: ReplicaEndpoint
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    inflight: int = 0
    seqs: int = 0
    """Sequences (n x prompts) of this router's open requests."""
    max_model_len: int = 0
    """The engine's context as its /v1/models says (0: not learnt yet; -1: it says none)."""
    latency_ms: float = 0.0
    failures: int = 0
    open_until: float = 0.0
    cached: Candidate | None = None
    """This replica in the last snapshot; None once anything above changed."""

    def candidate(self, now: float) -> Candidate:
        return Candidate(self.endpoint, ReplicaLoad(self.running, self.waiting, self.kv_usage, self.inflight,
                                                    self.latency_ms, now < self.open_until, self.seqs,
                                                    max(self.max_model_len, 0)))


class Replicas:
    def __init__(self, table: RoutingTable, breaker_failures: int, breaker_open_s: float,
                 max_num_seqs: int = 0) -> None:
        """`max_num_seqs`: an engine's sequence limit where the routing table gives none (0: the
        routing filters' default)."""
        self.table = table
        self.served = frozenset(table.models())
        self.mixed = _mixed(table)
        self.declared = _declared(table)
        self.max_num_seqs = max_num_seqs
        self._mixed_for: dict[str, frozenset[str]] = {}
        self.states = {r.replica_id: ReplicaState(self._limited(r)) for r in table.replicas}
        self.contexts: dict[str, int] = {}
        """Each model's smallest max_model_len among its engines that said (`context`)."""
        self.largest: dict[str, int] = {}
        """Each model's largest max_model_len among its engines that said: the most a request of
        it may need (`router.call.read_call`), what /v1/models reports."""
        self.breaker_failures, self.breaker_open_s = breaker_failures, breaker_open_s
        self.kv_watch: KvWatch | None = None
        """The PD pairs' KV transfers (config `pd.kv_path`): decodes' NIXL counters go there."""
        self._awaiting: list[asyncio.Future[None]] = []
        """Requests waiting for a newer table (`newer`), woken by `follow`."""

    def follow(self, table: RoutingTable) -> None:
        """A newer routing table: keep what we learnt about replicas that stay."""
        if not table.supersedes(self.table):
            return
        old = self.states
        if self.kv_watch is not None:  # a moved replica's pairs: the old path's evidence says nothing of the new
            where = {r.replica_id: (r.node, r.gpus) for r in table.replicas}
            self.kv_watch.forget({rid for rid, st in old.items()
                                  if where.get(rid) != (st.endpoint.node, st.endpoint.gpus)})
        limited = [self._limited(r) for r in table.replicas]
        self.states = {r.replica_id: _carried(old[r.replica_id], r) if r.replica_id in old else ReplicaState(r)
                       for r in limited}
        self.table = table
        self.served = frozenset(table.models())
        self.mixed = _mixed(table)
        self.declared = _declared(table)
        self._mixed_for = {}
        self._learn_contexts()
        awaiting, self._awaiting = self._awaiting, []
        for waiter in awaiting:
            if not waiter.done():
                waiter.set_result(None)

    @property
    def awaiting(self) -> int:
        """Requests waiting for a newer table now."""
        return len(self._awaiting)

    async def newer(self, timeout_s: float) -> bool:
        """Until `follow` takes a newer routing table (True), at most `timeout_s` (False). A
        request that no replica of this view can take waits here for the table its cause
        published: a scale-in that stopped the engines this view still lists, a replica restarted
        on another port, one just started (the controller publishes each at once; the router
        follows within a second)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._awaiting.append(waiter)
        try:
            await asyncio.wait_for(waiter, timeout_s)
        except TimeoutError:
            return False
        finally:
            if waiter in self._awaiting:
                self._awaiting.remove(waiter)
        return True

    def context(self, model: str) -> int | None:
        """The longest max_tokens every engine of `model` takes (vLLM refuses more than its
        max_model_len), once one said; None before."""
        return self.contexts.get(model)

    def _learn_contexts(self) -> None:
        known: dict[str, int] = {}
        largest: dict[str, int] = {}
        for st in self.states.values():
            if st.max_model_len > 0:
                model = st.endpoint.model
                known[model] = min(known.get(model, st.max_model_len), st.max_model_len)
                largest[model] = max(largest.get(model, 0), st.max_model_len)
        self.contexts, self.largest = known, largest

    def mixed_for(self, slo_class: str) -> frozenset[str]:
        """Models with mixed replicas that serve `slo_class` (`filters.serves_class`): where a
        class's pools are all prefill/decode, its short prompts split over PD too."""
        found = self._mixed_for.get(slo_class)
        if found is None:
            declared = self.declared
            found = self._mixed_for[slo_class] = frozenset(
                r.model for r in self.table.replicas
                if r.role == "mixed" and (not r.slo_classes or slo_class in r.slo_classes
                                          or ((r.model, slo_class) not in declared and (r.model, "*") not in declared)))
        return found

    def _limited(self, r: ReplicaEndpoint) -> ReplicaEndpoint:
        """The endpoint with the configured sequence limit where the table gives none."""
        return r if r.max_num_seqs or not self.max_num_seqs else replace(r, max_num_seqs=self.max_num_seqs)

    def snapshot(self) -> list[Candidate]:
        """Every replica as a routing candidate. A replica's candidate is rebuilt only when its
        state changed (a request opened or closed, a scrape, a failure) or its breaker expired:
        the cost per request does not grow with the number of replicas."""
        now = time.monotonic()
        out = []
        for s in self.states.values():
            c = s.cached
            if c is None or (c.load.breaker_open and now >= s.open_until):
                c = s.cached = s.candidate(now)
            out.append(c)
        return out

    def opened(self, replica_id: str, seqs: int = 1) -> None:
        s = self.states.get(replica_id)
        if s is not None:
            s.inflight += 1
            s.seqs += seqs
            s.cached = None

    def closed(self, replica_id: str, seqs: int = 1) -> None:
        s = self.states.get(replica_id)
        if s is not None and s.inflight > 0:
            s.inflight -= 1
            s.seqs = max(0, s.seqs - seqs)
            s.cached = None

    def ok(self, replica_id: str, latency_ms: float) -> None:
        s = self.states.get(replica_id)
        if s is not None:
            s.cached = None
            s.failures = 0
            s.latency_ms = latency_ms if s.latency_ms == 0 else 0.8 * s.latency_ms + 0.2 * latency_ms

    def failed(self, replica_id: str, url: str | None = None) -> None:
        """A failure counts toward the replica's breaker, unless it came from an engine the replica
        no longer runs on (`url`: a decision made before a restart or a move, a retired engine cut
        at its drain timeout): that says nothing about the engine it runs on now."""
        s = self.states.get(replica_id)
        if s is None or (url is not None and url != s.endpoint.url):
            return
        s.failures += 1
        s.cached = None
        if s.failures >= self.breaker_failures:
            s.open_until = time.monotonic() + self.breaker_open_s

    async def scrape_forever(self, pool: Pool, interval_s: float, after: Callable[[], None] | None = None) -> None:
        """Every replica's /metrics each `interval_s`; the scrape connections close with this task."""
        try:
            while True:
                states = list(self.states.values())
                await asyncio.gather(*(self._scrape(pool, s) for s in states))
                await pool.keep({s.endpoint.url for s in states})
                if after is not None:
                    after()
                await asyncio.sleep(interval_s)
        finally:
            await pool.aclose()

    async def _scrape(self, pool: Pool, s: ReplicaState) -> None:
        if not s.max_model_len:  # asked until the engine answers; -1: it answered without one
            with contextlib.suppress(UpstreamError, ValueError):
                s.max_model_len = model_context(await pool.text(s.endpoint.url, "/v1/models"), s.endpoint.model) or -1
                s.cached = None
                self._learn_contexts()
        with contextlib.suppress(UpstreamError, ValueError):
            text = await pool.text(s.endpoint.url, "/metrics")
            if self.kv_watch is not None and s.endpoint.role == "decode":
                self.kv_watch.scraped(s.endpoint.replica_id, nixl_totals(text), time.monotonic())
            values = parse_vllm_metrics(text)
            s.running = values.get("running", s.running)
            s.waiting = values.get("waiting", s.waiting)
            s.kv_usage = values.get("kv_usage", s.kv_usage)
            s.cached = None


def model_context(text: str, model: str) -> int:
    """`model`'s max_model_len in an engine's /v1/models (vLLM's ModelCard); 0 when it says none."""
    found = json.loads(text)
    cards = found.get("data") if isinstance(found, dict) else None
    for card in cards if isinstance(cards, list) else []:
        value = card.get("max_model_len") if isinstance(card, dict) and card.get("id") == model else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def _carried(state: ReplicaState, endpoint: ReplicaEndpoint) -> ReplicaState:
    """A replica in the newer table: the same engine keeps what we learnt about it; a new one (the
    engine restarted on another port, or the replica moved) starts afresh, breaker closed, but for
    the requests this router still has open under its id (they close against it)."""
    if state.endpoint.url == endpoint.url:
        return replace(state, endpoint=endpoint, cached=None)
    return ReplicaState(endpoint, inflight=state.inflight, seqs=state.seqs)


def _mixed(table: RoutingTable) -> frozenset[str]:
    """Models that have mixed replicas (short prompts are served whole there)."""
    return frozenset(r.model for r in table.replicas if r.role == "mixed")


def _declared(table: RoutingTable) -> frozenset[tuple[str, str]]:
    """(model, class) for each class a pool of the model is declared for; (model, "*") where a
    pool declares none (it serves every class)."""
    return frozenset((r.model, c) for r in table.replicas for c in r.slo_classes or ("*",))
