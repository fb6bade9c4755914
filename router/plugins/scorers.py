"""Scorers: how good one candidate is for the request, in [0, 1]. A profile adds them up,
each times its weight; every parameter has a default and a reason."""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence

from physics.costmodel import TIER_QUALITY
from router.plugins.model import Candidate, RouteRequest, Scorer
from router.plugins.params import Params
from router.plugins.pull import best_pull

RUNNING_WEIGHT = 0.25
"""queue-depth-scorer: what a running request costs a newcomer, against 1 for a waiting one. A
waiting request is served before it; a running one only shares each step with it (continuous
batching), and the router's own in-flight count overlaps the engine's running count."""
UNKNOWN_TIER = 0.1
"""link-tier-scorer: a tier the table names but TIER_QUALITY does not (between rdma and tcp)."""
NO_PREFIX = 0.5
"""prefix-affinity-scorer: a request without a prefix key prefers no replica (the middle)."""


class QueueDepthScorer(Scorer):
    def __init__(self, running_weight: float) -> None:
        self.running_weight = running_weight

    def score(self, req: RouteRequest, c: Candidate) -> float:
        load = c.load
        return 1.0 / (1.0 + load.waiting + self.running_weight * (load.running + load.inflight))

    def scores(self, req: RouteRequest, cands: Sequence[Candidate]) -> list[float]:
        weight = self.running_weight  # `score`, inlined: the default profile's one scorer, every request
        return [1.0 / (1.0 + load.waiting + weight * (load.running + load.inflight)) for _, load in cands]


class KvUsageScorer(Scorer):
    def score(self, req: RouteRequest, c: Candidate) -> float:
        return max(0.0, 1.0 - c.load.kv_usage)


class LinkTierScorer(Scorer):
    """The quality of the replica's TP group tier (`physics.costmodel.TIER_QUALITY`)."""

    def __init__(self, tiers: Mapping[str, float], unknown: float) -> None:
        self.tiers = dict(tiers)
        self.unknown = unknown

    def score(self, req: RouteRequest, c: Candidate) -> float:
        return self.tiers.get(c.endpoint.tier, self.unknown)


class LinkHealthScorer(Scorer):
    """Topology health of the replica's TP group times how its observed latency compares with
    the class's TTFT target (a replica slower than the target scores under 0.5)."""

    def score(self, req: RouteRequest, c: Candidate) -> float:
        observed = c.load.latency_ms / max(req.slo_class.ttft_ms, 1.0)
        return c.endpoint.health_score / (1.0 + observed)


class PrefixAffinityScorer(Scorer):
    """Rendezvous hash of the prompt's leading blocks: the same prefix prefers the same replica
    (whose cache holds it), different prefixes spread evenly."""

    def __init__(self, no_prefix: float) -> None:
        self.no_prefix = no_prefix

    def score(self, req: RouteRequest, c: Candidate) -> float:
        if not req.prefix_hash:
            return self.no_prefix
        return (zlib.crc32(f"{req.prefix_hash}:{c.endpoint.replica_id}".encode()) % 10_000) / 10_000


class KvCacheScorer(Scorer):
    """The share of the prompt's full blocks the replica's prefix cache holds, from the engines'
    KV events (`router.kvindex`): a replica that would prefill less scores higher. Without an
    index's answer (no `kv_events`, no replica of the model publishing, a prompt the router
    could not key), it falls back to the prompt-hash affinity (`prefix-affinity-scorer`'s
    rendezvous hash of the prompt's leading blocks; `no_index` for a prompt without one, and
    the router counts `isle_router_prefix_fallbacks`). With `peer_pull`
    (the deployment's KV connector reads blocks from peers), a prefix a peer holds and the
    replica could pull faster than it would compute it counts too, discounted by the pull's
    cost against the compute it saves (`router.plugins.pull`): an island neighbour of the
    holder scores almost as high as the holder, a replica across the network less."""

    def __init__(self, no_index: float, peer_pull: bool = False) -> None:
        self.no_index = no_index
        self.peer_pull = peer_pull
        self.fallback = PrefixAffinityScorer(no_index)
        """Without an index's answer: the prompt-hash affinity (`no_index` without a prefix)."""

    def score(self, req: RouteRequest, c: Candidate) -> float:
        return self.scores(req, (c,))[0]

    def scores(self, req: RouteRequest, cands: Sequence[Candidate]) -> list[float]:
        total = req.cacheable_tokens
        if total <= 0:
            return [self.fallback.score(req, c) for c in cands]
        out = []
        for c in cands:
            own = req.cached.get(c.endpoint.replica_id, 0)
            pull = best_pull(req, c, cands, RUNNING_WEIGHT) if self.peer_pull and req.cached else None
            held = own if pull is None else own + (pull.tokens - own) * (1.0 - pull.ms / pull.saved_ms)
            out.append(min(1.0, held / total))
        return out


def queue_depth(p: Params) -> Scorer:
    running_weight = p.number("running_weight", RUNNING_WEIGHT, 0.0, 100.0)
    p.done()
    return QueueDepthScorer(running_weight)


def kv_usage(p: Params) -> Scorer:
    p.done()
    return KvUsageScorer()


def link_tier(p: Params) -> Scorer:
    tiers = p.numbers("tiers", TIER_QUALITY, 0.0, 1.0)
    unknown = p.number("unknown", UNKNOWN_TIER, 0.0, 1.0)
    p.done()
    return LinkTierScorer(tiers, unknown)


def link_health(p: Params) -> Scorer:
    p.done()
    return LinkHealthScorer()


def kv_cache(p: Params) -> Scorer:
    no_index = p.number("no_index", NO_PREFIX, 0.0, 1.0)
    peer_pull = p.flag("peer_pull", False)
    p.done()
    return KvCacheScorer(no_index, peer_pull)


def prefix_affinity(p: Params) -> Scorer:
    no_prefix = p.number("no_prefix", NO_PREFIX, 0.0, 1.0)
    p.done()
    return PrefixAffinityScorer(no_prefix)
