"""What every placement policy shares: replica order, memory fit, building a placement
(island, tier, in-island flag), the plan score and the plan itself."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pools import catalog, costmodel
from pools.model import PlacementPlan, PlacementRequest, PoolSpec, ReplicaPlacement, Unplaced, replica_ids
from topology import GpuRef, Island, Topology, is_clique, islands, tier
from topology.islands import island_of

TIER_QUALITY = costmodel.TIER_QUALITY
"""How good a TP group's tier is for the plan score (defined, with its sources, in the cost model)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Work:
    """One replica to place."""

    replica_id: str
    pool: PoolSpec
    strictness: float


def replicas_in_order(request: PlacementRequest, sort: bool) -> list[Work]:
    """Pool order as declared (topology-blind baselines) or strictest, then largest TP first."""
    work = [Work(replica_id=rid, pool=p, strictness=request.strictness(p)) for p in request.pools
            for rid in request.replica_ids(p)]
    if sort:
        work.sort(key=lambda w: (-w.strictness, -w.pool.tp))
    return work


def gpu_memory_gb(topology: Topology, ref: GpuRef) -> float | None:
    gpu = topology.gpu(ref)
    if gpu.memory_gb:
        return gpu.memory_gb
    if gpu.model and gpu.model in catalog.gpus():
        return catalog.gpu(gpu.model).memory_gb
    return None


def memory_fits(topology: Topology, pool: PoolSpec, refs: Sequence[GpuRef]) -> bool:
    """True when the model's weights (and one long request's cache) fit, or the model is unknown."""
    if pool.model is None:
        return True
    model = catalog.model(pool.model)
    for ref in refs:
        mem = gpu_memory_gb(topology, ref)
        if mem is not None and not costmodel.fits(model, mem, pool.tp):
            return False
    return True


class Layout:
    """Islands of a topology with O(1) lookups, computed once per placement run."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.islands: list[Island] = islands(topology)
        self.of: dict[GpuRef, Island] = island_of(self.islands)

    def placement(self, work: Work, refs: Sequence[GpuRef], reasons: Iterable[str]) -> ReplicaPlacement:
        refs = sorted(refs)
        ids = sorted({self.of[r].id for r in refs})
        first = refs[0].node
        extra: dict[str, list[int]] = {}
        for r in refs:
            if r.node != first:
                extra.setdefault(r.node, []).append(r.index)
        return ReplicaPlacement(
            replica_id=work.replica_id, pool=work.pool.name, role=work.pool.role, node=first,
            gpus=tuple(r.index for r in refs if r.node == first), island="+".join(ids),
            tier=tier(self.topology, refs), in_island=len(refs) == 1 or is_clique(self.topology, refs),
            reasons=tuple(reasons), extra_nodes=tuple((n, tuple(g)) for n, g in sorted(extra.items())),
        )


def unplaced_summary(missing: Sequence[tuple[Work, str]]) -> tuple[Unplaced, ...]:
    grouped: dict[tuple[str, str], int] = {}
    for work, reason in missing:
        key = (work.pool.name, reason)
        grouped[key] = grouped.get(key, 0) + 1
    return tuple(Unplaced(pool=p, count=n, reason=r) for (p, r), n in grouped.items())


def score(topology: Topology, request: PlacementRequest, placements: Sequence[ReplicaPlacement]) -> float:
    """Weighted mean placement quality in [0, 1]; an unplaced replica counts 0.

    Quality is the tier's (TIER_QUALITY) times the worst link health inside the group; each
    replica weighs 1 + its pool's strictness share, so strict pools on bad links cost more.
    """
    total = sum(p.replicas for p in request.pools)
    if total == 0:
        return 1.0
    top = max((request.strictness(p) for p in request.pools), default=0.0) or 1.0
    weight = {p.name: 1.0 + request.strictness(p) / top for p in request.pools}
    got = 0.0
    for pl in placements:
        health = 1.0
        refs = [GpuRef(n, g) for n, g in pl.gpu_refs()]
        for i, a in enumerate(refs):
            for b in refs[i + 1:]:
                if a.node == b.node:
                    link = topology.node(a.node).link(a.index, b.index)
                    if link is not None:
                        health = min(health, link.health.score)
        got += weight[pl.pool] * TIER_QUALITY[pl.tier] * health
    return got / sum(weight[p.name] * p.replicas for p in request.pools)


def finish(name: str, request: PlacementRequest, placements: list[ReplicaPlacement],
           missing: Sequence[tuple[Work, str]], reasons: Sequence[str] = ()) -> PlacementPlan:
    order = {rid: k for k, rid in enumerate(r for p in request.pools for r in replica_ids(p))}
    order.update({rid: len(order) + k for k, rid in enumerate(
        r for p in request.pools for r in request.replica_ids(p) if r not in order)})
    placements.sort(key=lambda p: order[p.replica_id])
    return PlacementPlan(
        policy=name, topology_fingerprint=request.topology.fingerprint(), placements=tuple(placements),
        unplaced=unplaced_summary(missing), score=score(request.topology, request, placements),
        reasons=tuple(reasons), pools=request.pools, slo_classes=dict(request.slo_classes),
    )


def healthy_refs(topology: Topology) -> list[GpuRef]:
    return [GpuRef(n.name, g.index) for n in topology.nodes for g in n.gpus if g.healthy]
