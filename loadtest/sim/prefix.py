"""Prefix caches in the simulator: what the router's KV index says each replica holds of a
prompt (read from the engines' caches directly: the index without its events' milliseconds of
lag), and the pulls the kv-cache-scorer's `peer_pull` counts on — the winner reads the prompt's
leading blocks from a peer's cache over the topology's links (sharing them with every other
transfer, `loadtest.sim.network`), then they join its cache and the request starts there."""

from __future__ import annotations

from collections.abc import Sequence

from loadtest.sim.model import KV_READY, _Req
from loadtest.sim.network import legs
from loadtest.sim.replica import SimReplica
from loadtest.sim.state import SimState
from physics import kvtransfer
from router.plugins.model import Candidate, RouteRequest
from router.plugins.profile import Profile
from router.plugins.pull import Pull, best_pull
from router.plugins.scorers import RUNNING_WEIGHT, KvCacheScorer
from topology import GpuRef

BLOCK_SIZE = 16
"""The engines' KV block size (`simengine.core.EngineConfig`'s, vLLM's default): the router's
index keys prompts in these."""


def cached(sim: SimState, req: _Req) -> None:
    """The request's route with what each replica's cache holds of its prompt now."""
    if not req.keys:
        return
    held = {}
    for r in sim.by_model.get(req.route.model, ()):
        if r.core.cache is not None and (n := r.core.cache.hit(req.keys)):
            held[r.rid] = n * BLOCK_SIZE
    req.route = req.route._replace(cacheable_tokens=len(req.keys) * BLOCK_SIZE, cached=held)


def pull_of(profile: Profile, req: RouteRequest, winner: Candidate, snapshot: Sequence[Candidate]) -> Pull | None:
    """The pull the profile's kv-cache-scorer counted for the winner (with `peer_pull`)."""
    for _, scorer, _ in profile.scorer_plugins:
        if isinstance(scorer, KvCacheScorer) and scorer.peer_pull:
            return best_pull(req, winner, snapshot, RUNNING_WEIGHT)
    return None


def start_pull(sim: SimState, t: float, req: _Req, target: SimReplica, pull: Pull) -> bool:
    """The transfer of what `target` lacks of `pull.tokens` from `pull.source` (False: none)."""
    source = sim.replicas.get(pull.source)
    if source is None or not source.alive or target.core.cache is None:
        return False
    moved = pull.tokens - req.route.cached.get(target.rid, 0)
    gb = kvtransfer.kv_bytes(target.core.config.model, moved) / 1e9
    src = [GpuRef(source.placement.node, g) for g in source.placement.gpus]
    dst = [GpuRef(target.placement.node, g) for g in target.placement.gpus]
    route, latency_s = legs(sim.topology, src, dst, gb, model=target.core.config.model)
    req.pull, req.phase = pull, "pull"
    sim.pulled += moved
    if not route:
        sim._at(t, KV_READY, req)
        return True
    sim.next_transfer += 1
    sim.transfers[sim.next_transfer] = req
    sim.network.start(t, sim.next_transfer, route)
    req.kv_latency_s = latency_s
    sim._schedule_net()
    return True


def pulled(sim: SimState, t: float, req: _Req) -> None:
    """The pulled blocks arrived: they join the target's cache and the request starts there."""
    rep = sim.replicas[req.replica]
    if not rep.alive:
        sim._record(req, t, "lost")
        return
    assert req.pull is not None
    rep.core.adopt(req.tokens[:req.pull.tokens])
    req.phase = "decode"
    sim._assign(t, rep, req, req.trace.output_tokens)
