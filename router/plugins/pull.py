"""Reading a cached prefix from a peer instead of computing it: when a deployment's KV connector
can pull blocks from another replica of the model (LMCache's peer-to-peer sharing, NIXL reads),
a candidate that lacks a prompt's prefix which a peer holds can have it moved instead of
prefilled. Whether that pays is physics: the KV of the missing tokens over the paths between the
two replicas' GPUs (`router.plugins.pd.kv_route`: an NVLink-island neighbour moves it in well
under a millisecond per thousand tokens, another rack takes tens of times longer) against their
prefill on the candidate's own hardware after the context it already holds (cost model).

`best_pull` is that choice for one candidate: the holder with the most of the prompt beyond the
candidate's own, if moving its extra tokens is faster than computing them, among holders
busier than the candidate by at least `PULL_BACKLOG` waiting requests' worth (the queue-depth scorer's
measure: waiting, and running or in flight at its `running_weight` each). A holder about as busy
as the candidate serves its own prefix best (a copy takes cache room from other prefixes), so
under light or even load nothing is pulled. The kv-cache-scorer
with `peer_pull` counts such a pullable prefix as cached, discounted by what the pull costs
against the compute it saves; the offline simulator executes the pull the winner's score
assumed. Without a topology (`RouteRequest.topology` None) paths are the named fallbacks
(`physics.kvtransfer.KV_*_FALLBACK`: one node or not).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from physics import catalog, costmodel, kvtransfer
from router.plugins.model import Candidate, ReplicaLoad, RouteRequest
from router.plugins.pd import kv_route
from router.plugins.ttft import FALLBACK_MODEL, hardware

PULL_BACKLOG = 4.0
"""How much busier than the candidate a holder must be for its prefix to be pulled: four waiting
requests' worth (or sixteen running). A pulled copy takes cache room that other prefixes held,
so pulling for a small imbalance costs more hits than it saves queueing (measured on
configs/scenarios/agentic.yaml with 100k-token caches: at 1.0, TTFT p50 +7 % against not
pulling)."""


class Pull(NamedTuple):
    source: str
    """The replica whose cache the prefix is read from."""
    tokens: int
    """Leading prompt tokens the target then holds (the source's share of the prompt)."""
    ms: float
    """Moving what the target lacked of them."""
    saved_ms: float
    """Computing that on the target instead (the prefill it no longer does)."""


def pull_ms(req: RouteRequest, source: Candidate, target: Candidate, tokens: int) -> float:
    """Moving `tokens` tokens of KV from `source`'s GPUs to `target`'s (rank i to rank i)."""
    s, t = source.endpoint, target.endpoint
    model = catalog.models().get(s.catalog_model or "") or catalog.model(FALLBACK_MODEL)
    ms_per_byte, latency_ms, _ = kv_route(model, req.topology, s.node, s.gpus, t.node, t.gpus)
    return kvtransfer.kv_bytes(model, tokens) * ms_per_byte + latency_ms


def backlog(load: ReplicaLoad, running_weight: float) -> float:
    return load.waiting + running_weight * (load.running + load.inflight)


def best_pull(req: RouteRequest, c: Candidate, cands: Sequence[Candidate], running_weight: float) -> Pull | None:
    """The pull that saves `c` the most time, if any saves time at all."""
    if req.cacheable_tokens <= 0:
        return None
    own = req.cached.get(c.endpoint.replica_id, 0)
    busy = backlog(c.load, running_weight) + PULL_BACKLOG
    best: Pull | None = None
    hw = None
    for h in cands:
        more = req.cached.get(h.endpoint.replica_id, 0)
        if more <= own or backlog(h.load, running_weight) < busy or h.endpoint.replica_id == c.endpoint.replica_id \
                or h.endpoint.model != c.endpoint.model:
            continue
        if hw is None:
            hw = hardware(c.endpoint, req.topology)
        saved = costmodel.prefill_ms(hw.model, hw.gpu, hw.tp, hw.link, more - own, context_tokens=own, ep=hw.ep)
        moved = pull_ms(req, h, c, more - own)
        if moved < saved and (best is None or saved - moved > best.saved_ms - best.ms):
            best = Pull(h.endpoint.replica_id, more, moved, saved)
    return best
