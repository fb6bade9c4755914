"""Routing decisions: pure functions of a snapshot (llm-d's shape: filters, weighted scorers in
[0, 1], a picker, profiles per SLO class). The live router and the offline simulator call the
same functions; a decision is a `RouteDecision` value that names every candidate's scores.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from pools import catalog, costmodel
from pools.model import Role, SLOClass
from pools.placement.common import TIER_QUALITY
from pools.routing import ReplicaEndpoint
from topology import GpuRef, Topology, path
from topology.paths import Path


class ReplicaLoad(NamedTuple):  # built for every replica on every request: tuples are cheap
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    inflight: int = 0
    """Requests this router has open on the replica right now."""
    latency_ms: float = 0.0
    """The router's own moving average of the replica's time to first byte."""
    breaker_open: bool = False


class Candidate(NamedTuple):
    endpoint: ReplicaEndpoint
    load: ReplicaLoad = ReplicaLoad()


class RouteRequest(NamedTuple):
    model: str
    slo_class: SLOClass
    prompt_tokens: int
    prefix_hash: int = 0
    role: Role | None = None


class Ranked(NamedTuple):
    replica_id: str
    total: float
    scores: Mapping[str, float]
    candidate: Candidate


class RouteDecision:
    """One routing decision: the winner and, on demand, the ranked candidates with each scorer's
    score (computed only when someone looks: a log line, a test, the admin API)."""

    __slots__ = ("_cands", "_keyed", "_plugins", "_ranked", "_req", "reason", "winner")

    def __init__(self, winner: Candidate | None, reason: str, cands: Sequence[Candidate] = (),
                 keyed: Sequence[tuple[float, str, int]] = (),
                 plugins: Sequence[tuple[str, Scorer, float]] = (), req: RouteRequest | None = None) -> None:
        self.winner, self.reason = winner, reason
        self._cands, self._keyed, self._plugins, self._req = cands, keyed, plugins, req
        self._ranked: tuple[Ranked, ...] | None = None

    @property
    def ranked(self) -> tuple[Ranked, ...]:
        """The best RANKED_KEEP candidates, best first, with their per-scorer scores."""
        if self._ranked is None:
            req, cands = self._req, self._cands
            self._ranked = tuple(
                Ranked(rid, -neg, {name: fn(req, cands[i]) for name, fn, _ in self._plugins} if req else {}, cands[i])
                for neg, rid, i in self._keyed[:RANKED_KEEP])
        return self._ranked

    def log_line(self) -> str:
        parts = " ".join(f"{r.replica_id}={r.total:.3f}" for r in self.ranked[:6])
        return f"route -> {self.winner.endpoint.replica_id if self.winner else 'none'} ({self.reason}) [{parts}]"

    def order(self) -> list[Candidate]:
        """Replicas to try: the winner, then the rest best first (retries before the first byte)."""
        if self.winner is None:
            return []
        won, cands = self.winner.endpoint.replica_id, self._cands
        return [self.winner, *(cands[i] for _, rid, i in self._keyed[:RANKED_KEEP] if rid != won)]


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    filters: tuple[str, ...] = ("health-filter", "drain-filter", "role-filter")
    scorers: Mapping[str, float] = field(default_factory=lambda: {"queue-depth-scorer": 1.0})
    picker: str = "max-score-picker"


Filter = Callable[[RouteRequest, list[Candidate]], list[Candidate]]
Scorer = Callable[[RouteRequest, Candidate], float]


def _health(req: RouteRequest, cands: list[Candidate]) -> list[Candidate]:
    return [c for c in cands if c.endpoint.healthy and not c.load.breaker_open]


def _drain(req: RouteRequest, cands: list[Candidate]) -> list[Candidate]:
    """A draining replica takes no new traffic of the classes that are not sheddable."""
    return cands if req.slo_class.sheddable else [c for c in cands if not c.endpoint.draining]


def _role(req: RouteRequest, cands: list[Candidate]) -> list[Candidate]:
    want = req.role or "mixed"
    return [c for c in cands if c.endpoint.role == want]


FILTERS: dict[str, Filter] = {"health-filter": _health, "drain-filter": _drain, "role-filter": _role}


def _queue(req: RouteRequest, c: Candidate) -> float:
    return 1.0 / (1.0 + c.load.waiting + 0.25 * (c.load.running + c.load.inflight))


def _kv(req: RouteRequest, c: Candidate) -> float:
    return max(0.0, 1.0 - c.load.kv_usage)


def _tier(req: RouteRequest, c: Candidate) -> float:
    return TIER_QUALITY.get(c.endpoint.tier, 0.1)


def _link_health(req: RouteRequest, c: Candidate) -> float:
    """Topology health of the replica's TP group times how its observed latency compares with
    the class's TTFT target (a replica slower than the target scores under 0.5)."""
    observed = c.load.latency_ms / max(req.slo_class.ttft_ms, 1.0)
    return c.endpoint.health_score / (1.0 + observed)


def _prefix(req: RouteRequest, c: Candidate) -> float:
    """Rendezvous hash of the prompt's leading blocks: the same prefix prefers the same replica."""
    if not req.prefix_hash:
        return 0.5
    return (zlib.crc32(f"{req.prefix_hash}:{c.endpoint.replica_id}".encode()) % 10_000) / 10_000


SCORERS: dict[str, Scorer] = {
    "queue-depth-scorer": _queue, "kv-usage-scorer": _kv, "link-tier-scorer": _tier,
    "link-health-scorer": _link_health, "prefix-affinity-scorer": _prefix,
}
PICKERS = ("max-score-picker", "round-robin-picker", "random-picker")


def check_profile(profile: Profile) -> None:
    unknown = [f for f in profile.filters if f not in FILTERS] + [s for s in profile.scorers if s not in SCORERS]
    if profile.picker not in PICKERS:
        unknown.append(profile.picker)
    if unknown:
        known = ", ".join([*FILTERS, *SCORERS, *PICKERS])
        raise ValueError(f"unknown routing plugins {unknown} (known: {known})")


def _fast_filter(req: RouteRequest, candidates: Sequence[Candidate]) -> list[Candidate]:
    """The default filters (health, drain, role) and the model match in one pass."""
    model, want, sheddable = req.model, req.role or "mixed", req.slo_class.sheddable
    return [c for c in candidates if c.endpoint.model == model and c.endpoint.healthy and not c.load.breaker_open
            and (sheddable or not c.endpoint.draining) and c.endpoint.role == want]


DEFAULT_FILTERS = ("health-filter", "drain-filter", "role-filter")
RANKED_KEEP = 16
"""A decision names this many best candidates with their scores (retries and logs use the top)."""


def decide(req: RouteRequest, candidates: Sequence[Candidate], profile: Profile, rng: random.Random,
           turn: int = 0) -> RouteDecision:
    """Filter, score, pick. `turn` is the round-robin position (the caller's counter)."""
    cands = _fast_filter(req, candidates) if profile.filters == DEFAULT_FILTERS else []
    if not cands:  # the general path (it also says which filter left nothing)
        model = req.model
        cands = [c for c in candidates if c.endpoint.model == model]
        if not cands:
            return RouteDecision(None, f"no replica serves {req.model}")
        for name in profile.filters:
            cands = FILTERS[name](req, cands)
            if not cands:
                return RouteDecision(None, f"{name} left no replica")
    plugins = [(name, SCORERS[name], weight) for name, weight in profile.scorers.items()]
    if len(plugins) == 1:
        _, fn, weight = plugins[0]
        keyed = [(-weight * fn(req, c), c.endpoint.replica_id, i) for i, c in enumerate(cands)]
    else:
        keyed = [(-sum(w * f(req, c) for _, f, w in plugins), c.endpoint.replica_id, i) for i, c in enumerate(cands)]
    keyed.sort()  # best first; ties by replica id
    if profile.picker == "round-robin-picker":
        winner = sorted(cands, key=_replica_id)[turn % len(cands)]
    elif profile.picker == "random-picker":
        winner = rng.choice(cands)
    else:
        top = keyed[0][0] + 1e-9
        best = [k for k in keyed if k[0] <= top]
        winner = cands[(rng.choice(best) if len(best) > 1 else best[0])[2]]
    return RouteDecision(winner, f"{profile.picker} of {len(cands)}", cands, keyed, plugins, req)


def _rank_key(r: Ranked) -> tuple[float, str]:
    return -r.total, r.replica_id


def _replica_id(c: Candidate) -> str:
    return c.endpoint.replica_id


@dataclass(frozen=True, slots=True, kw_only=True)
class PDDecision:
    prefill: Candidate
    decode: Candidate
    predicted_ttft_ms: float
    kv_ms: float
    tier: str
    """Tier of the KV path (prefill GPUs + decode GPUs)."""
    ranked: tuple[tuple[str, str, float], ...]
    decode_order: tuple[Candidate, ...] = ()
    """Decodes to try for this prefill, best first (any decode can claim the prefill's KV)."""
    tiers: Mapping[str, str] = field(default_factory=dict)
    """KV-path tier per decode replica id."""


def _prefill_ms(c: Candidate, tokens: int) -> float | None:
    e = c.endpoint
    if not e.catalog_model or not e.gpu_model or e.catalog_model not in catalog.models() \
            or e.gpu_model not in catalog.gpus():
        return None
    link = costmodel.LinkCost(bandwidth_gb_s=450.0, latency_us=0.5)
    return costmodel.prefill_ms(catalog.model(e.catalog_model), catalog.gpu(e.gpu_model), e.tp, link, tokens)


def pd_decide(req: RouteRequest, snapshot: Sequence[Candidate], topology: Topology | None, *, min_prompt_tokens: int,
              has_mixed: bool) -> PDDecision | None:
    """Whether to disaggregate this request, and the pair: None sends it whole to a mixed replica
    (a prompt under `min_prompt_tokens` when the model has mixed replicas, or no healthy pair).
    `has_mixed`: the routing table has mixed replicas of the model, healthy or not (a PD-only
    deployment splits every prompt). The router and the offline simulator both call this."""
    if req.prompt_tokens < min_prompt_tokens and has_mixed:
        return None
    model, sheddable = req.model, req.slo_class.sheddable
    live = [c for c in snapshot if c.endpoint.model == model and c.endpoint.healthy and not c.load.breaker_open
            and (sheddable or not c.endpoint.draining)]
    prefills = [c for c in live if c.endpoint.role == "prefill"]
    decodes = [c for c in live if c.endpoint.role == "decode"]
    if not prefills or not decodes:
        return None
    return pd_pair(req, prefills, decodes, topology)


def pd_pair(req: RouteRequest, prefills: Sequence[Candidate], decodes: Sequence[Candidate],
            topology: Topology | None) -> PDDecision | None:
    """The prefill/decode pair with the lowest predicted TTFT: prefill queue + prefill time + KV
    transfer over the path between the two replicas + decode admission."""
    best: PDDecision | None = None
    ranked = []
    tiers: dict[tuple[str, str], str] = {}
    for p in prefills:
        pre = _prefill_ms(p, req.prompt_tokens)
        per_request = pre if pre is not None else 50.0
        for d in decodes:
            if d.endpoint.model != p.endpoint.model:
                continue
            kv, tier_name = _kv_ms(p, d, req.prompt_tokens, topology)
            tiers[(p.endpoint.replica_id, d.endpoint.replica_id)] = tier_name
            queue = (p.load.waiting + p.load.inflight) * per_request
            admission = d.load.waiting * 20.0 + d.load.kv_usage * 50.0
            predicted = queue + per_request + kv + admission
            ranked.append((p.endpoint.replica_id, d.endpoint.replica_id, predicted))
            if best is None or predicted < best.predicted_ttft_ms:
                best = PDDecision(prefill=p, decode=d, predicted_ttft_ms=predicted, kv_ms=kv, tier=tier_name,
                                  ranked=())
    if best is None:
        return None
    ranked.sort(key=lambda r: r[2])
    chosen = best.prefill.endpoint.replica_id
    by_id = {d.endpoint.replica_id: d for d in decodes}
    order = tuple(by_id[d] for p, d, _ in ranked if p == chosen)
    return PDDecision(prefill=best.prefill, decode=best.decode, predicted_ttft_ms=best.predicted_ttft_ms,
                      kv_ms=best.kv_ms, tier=best.tier, ranked=tuple(ranked[:8]), decode_order=order,
                      tiers={d: t for (p, d), t in tiers.items() if p == chosen})


def _kv_ms(p: Candidate, d: Candidate, tokens: int, topology: Topology | None) -> tuple[float, str]:
    pe, de = p.endpoint, d.endpoint
    if topology is None or not pe.gpus or not de.gpus or not topology.has_node(pe.node) \
            or not topology.has_node(de.node):
        return 0.0, "local" if pe.node == de.node and pe.node else "rdma"
    worst, tier_name = _kv_path(topology, pe.node, pe.gpus, de.node, de.gpus)
    model = catalog.models().get(pe.catalog_model or "")
    ms = costmodel.kv_transfer_ms(model, tokens, worst) if model is not None else worst.latency_us / 1000
    return ms, tier_name


_PATHS: dict[tuple[int, str, tuple[int, ...], str, tuple[int, ...]], tuple[Topology, Path, str]] = {}


def _kv_path(topology: Topology, pnode: str, pgpus: tuple[int, ...], dnode: str, dgpus: tuple[int, ...]
             ) -> tuple[Path, str]:
    """The KV path between two replicas and its tier: a function of the (immutable) topology and
    the two GPU groups, so remembered — a PD decision weighs every prefill/decode pair."""
    key = (id(topology), pnode, pgpus, dnode, dgpus)
    found = _PATHS.get(key)
    if found is not None and found[0] is topology:
        return found[1], found[2]
    from topology import tier

    refs = [GpuRef(pnode, g) for g in pgpus] + [GpuRef(dnode, g) for g in dgpus]
    worst = path(topology, GpuRef(pnode, pgpus[0]), GpuRef(dnode, dgpus[0]))
    if len(_PATHS) > 65536:
        _PATHS.clear()
    _PATHS[key] = (topology, worst, tier(topology, refs))
    return worst, _PATHS[key][2]
