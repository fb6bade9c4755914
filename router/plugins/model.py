"""What routing plugins see and are: the snapshot's value types (`Candidate`, `ReplicaLoad`,
`RouteRequest`), a plugin's config entry (`PluginSpec`) and the three plugin kinds.

A filter keeps or drops one candidate at a time (so the router runs a profile's filters in one
pass over the snapshot); a scorer says how good one candidate is, in [0, 1]; a picker chooses
the winner from the ranked candidates. Plugins are pure and synchronous: same input, same RNG
state, same answer.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import NamedTuple

from pools.model import Role, SLOClass
from pools.routing import ReplicaEndpoint
from topology import Topology

NO_BLOCKS: Mapping[str, int] = MappingProxyType({})


class ReplicaLoad(NamedTuple):  # built for every replica on every request: tuples are cheap
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    inflight: int = 0
    """Requests this router has open on the replica right now."""
    latency_ms: float = 0.0
    """The router's own moving average of the replica's time to first byte."""
    breaker_open: bool = False
    seqs: int = 0
    """Sequences (n x prompts) of the requests this router has open on the replica right now."""
    context: int = 0
    """The engine's context (max_model_len) as its /v1/models said; 0: not known."""


class Candidate(NamedTuple):
    endpoint: ReplicaEndpoint
    load: ReplicaLoad = ReplicaLoad()


class RouteRequest(NamedTuple):
    model: str
    slo_class: SLOClass
    prompt_tokens: int
    prefix_hash: int = 0
    role: Role | None = None
    seqs: int = 1
    """Sequences the request asks for (n x prompts)."""
    any_pool: bool = True
    """Every pool may serve it (`filters.serves_class`): no replica of the model is declared for
    the class nor open to every class. The live router says (`router.call.read_call`); a caller
    that does not (the offline simulator, for now) keeps pools' classes out of routing."""
    seq_share: float = 1.0
    """The part of a replica's sequence slots the class may fill (`filters.has_headroom`); the
    rest is kept for higher classes."""
    context_tokens: int = 0
    """The context one of its sequences needs (`filters.fits_context`): its longest prompt and
    max_tokens, at most the largest context among the model's engines (what vLLM would serve
    there); 0: any context holds it."""
    cacheable_tokens: int = 0
    """Tokens of its (first) prompt an engine could read from its prefix cache (its full KV blocks
    before its last token, which vLLM always computes), when the router indexes the engines'
    prefix caches (`router.kvindex`); 0: not indexed."""
    cached: Mapping[str, int] = NO_BLOCKS
    """Replica id -> how many of those leading tokens its prefix cache holds (absent: none); a
    prefill there computes only the rest (`router.plugins.pd`)."""
    topology: Topology | None = None
    """The physical graph the replicas run on, for scorers that price paths between them
    (`router.plugins.cachettft`); None: the named fallback paths."""


class Ranked(NamedTuple):
    replica_id: str
    total: float
    scores: Mapping[str, float]
    candidate: Candidate


Keyed = tuple[float, str, int]
"""A scored candidate as the picker sees it: (-total score, replica id, index into the candidates);
sorted ascending, best first, ties by replica id."""


class Filter:
    """Keeps the candidates that `keep` accepts."""

    def keep(self, req: RouteRequest, c: Candidate) -> bool:
        raise NotImplementedError

    def filter(self, req: RouteRequest, cands: Sequence[Candidate]) -> list[Candidate]:
        return [c for c in cands if self.keep(req, c)]


class Scorer:
    """How good a candidate is for the request, in [0, 1] (a profile weighs and adds them)."""

    def score(self, req: RouteRequest, c: Candidate) -> float:
        raise NotImplementedError

    def scores(self, req: RouteRequest, cands: Sequence[Candidate]) -> list[float]:
        """`score` of each candidate, in order (a scorer may compute them all in one pass)."""
        return [self.score(req, c) for c in cands]


class Picker:
    """The winner among the filtered candidates; `keyed` holds them scored, best first."""

    def pick(self, cands: Sequence[Candidate], keyed: Sequence[Keyed], rng: random.Random, turn: int) -> Candidate:
        raise NotImplementedError
