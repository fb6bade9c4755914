"""What every placement policy shares: replica order, memory fit, building a placement
(island, tier, in-island flag), the plan score and the plan itself."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from physics import catalog, costmodel
from physics.costmodel import TIER_QUALITY
from pools.model import (
    GangMember,
    PlacementPlan,
    PlacementRequest,
    PoolSpec,
    ReplicaPlacement,
    Unplaced,
    replica_ids,
)
from topology import GpuRef, Island, Topology, is_clique, islands, tier
from topology.islands import island_of
from topology.paths import TIERS


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


def nearest_nic(topology: Topology, node: str, gpus: Sequence[int], taken: set[str]) -> str | None:
    """The NIC closest to the first of `gpus` (a rank's rail), one not yet given to another rank
    of the gang on this node when an equally close one is free."""
    nics = topology.node(node).nics
    if not nics:
        return None
    first = gpus[0]

    def key(name: str, level: int) -> tuple[int, bool, str]:
        return (-level, name in taken, name)

    best = min(key(n.name, int(n.level_to(first) or 0)) for n in nics)
    return best[2]


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
        if mem is not None and not costmodel.fits(model, mem, pool.tp, pp=pool.pp, ep=pool.ep_size):
            return False
    return True


class Layout:
    """Islands of a topology with O(1) lookups, computed once per placement run."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.islands: list[Island] = islands(topology)
        self.of: dict[GpuRef, Island] = island_of(self.islands)

    def gang_placement(self, work: Work, groups: Sequence[Sequence[GpuRef]], reasons: Iterable[str]
                       ) -> ReplicaPlacement:
        """A gang from its TP groups in rank order (stage 0's DP ranks, then stage 1's, ...):
        one member per group and node, each with its nearest NIC."""
        pool = work.pool
        members: list[GangMember] = []
        taken: dict[str, set[str]] = {}
        for k, group in enumerate(groups):
            stage, rank = divmod(k, pool.dp)
            by_node: dict[str, list[int]] = {}
            for r in group:
                by_node.setdefault(r.node, []).append(r.index)
            for node, gpus in by_node.items():
                nic = nearest_nic(self.topology, node, gpus, taken.setdefault(node, set()))
                if nic is not None:
                    taken[node].add(nic)
                members.append(GangMember(node=node, gpus=tuple(gpus), dp_rank_start=rank, pp_stage=stage, nic=nic))
        refs = [r for g in groups for r in g]
        ids = sorted({self.of[r].id for r in refs})
        first = members[0]
        extra: dict[str, list[int]] = {}
        for r in sorted(refs):
            if r.node != first.node:
                extra.setdefault(r.node, []).append(r.index)
        in_island = all(len(g) == 1 or is_clique(self.topology, list(g)) for g in groups)
        return ReplicaPlacement(
            replica_id=work.replica_id, pool=pool.name, role=pool.role, node=first.node, gpus=first.gpus,
            island="+".join(ids), tier=tier(self.topology, refs), in_island=in_island, reasons=tuple(reasons),
            extra_nodes=tuple((n, tuple(g)) for n, g in sorted(extra.items())), members=tuple(members),
            in_domain=len(ids) == 1, expert_parallel=pool.expert_parallel,
        )

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


def largest_domain(layout: Layout, occupied: frozenset[GpuRef]) -> int:
    """Free healthy GPUs of the largest NVLink domain (island)."""
    topology = layout.topology
    return max((sum(1 for g in isl.gpus if topology.gpu(g).healthy and g not in occupied)
                for isl in layout.islands), default=0)


def cross_domain_ep(layout: Layout, occupied: frozenset[GpuRef], placements: Sequence[ReplicaPlacement]) -> int:
    """`PlacementPlan.cross_domain_ep`: EP gangs across domains that some domain could have held
    (its healthy GPUs not held before the plan, less those of EP gangs placed inside it: every
    other replica there could have gone elsewhere)."""
    spanning = [p for p in placements if p.expert_parallel and not p.in_domain]
    if not spanning:
        return 0
    topology = layout.topology
    room = {isl.id: sum(1 for g in isl.gpus if topology.gpu(g).healthy and g not in occupied)
            for isl in layout.islands}
    for p in placements:
        if p.members and p.in_domain and p.expert_parallel:
            isl = layout.of[GpuRef(p.node, p.gpus[0])]
            room[isl.id] -= len(p.gpu_refs())
    best = max(room.values(), default=0)
    return sum(1 for p in spanning if len(p.gpu_refs()) <= best)


def stage_groups(pl: ReplicaPlacement) -> list[list[GpuRef]]:
    """A gang's GPUs per pipeline stage, in rank order."""
    stages: dict[int, list[GpuRef]] = {}
    for m in pl.members:
        stages.setdefault(m.pp_stage, []).extend(GpuRef(m.node, g) for g in m.gpus)
    return [stages[s] for s in sorted(stages)]


def boundary_tier(topology: Topology, before: Sequence[GpuRef], after: Sequence[GpuRef]) -> str:
    """The tier an activation hand-off crosses between two stages: rank k of one stage sends to
    rank k of the next (the worst pair decides)."""
    worst = "local"
    for a, b in zip(before, after, strict=False):
        t = tier(topology, [a, b])
        if TIERS.index(t) > TIERS.index(worst):
            worst = t
    return worst


def pp_boundaries(topology: Topology, placements: Sequence[ReplicaPlacement]) -> dict[str, int]:
    out: dict[str, int] = {}
    for pl in placements:
        stages = stage_groups(pl) if pl.members else []
        for before, after in itertools.pairwise(stages):
            t = boundary_tier(topology, before, after)
            out[t] = out.get(t, 0) + 1
    return out


def with_expert_maps(topology: Topology, request: PlacementRequest,
                     placements: list[ReplicaPlacement]) -> list[ReplicaPlacement]:
    """EP gangs whose pool asks for an expert map get its figures (`pools.experts`)."""
    pools = {p.name: p for p in request.pools}
    if not any(p.experts is not None for p in pools.values()):
        return placements
    from dataclasses import replace

    from pools.experts.effect import figures
    from pools.ganglinks import gang_links

    out = []
    for pl in placements:
        pool = pools.get(pl.pool)
        wanted = pool is not None and pool.experts is not None and pl.members and pool.model is not None
        out.append(replace(pl, experts=figures(topology, pl, str(pool.model), pool.experts, gang_links(topology, pl)))
                   if wanted and pool is not None and pool.experts is not None else pl)
    return out


def finish(name: str, request: PlacementRequest, placements: list[ReplicaPlacement],
           missing: Sequence[tuple[Work, str]], reasons: Sequence[str] = (),
           layout: Layout | None = None) -> PlacementPlan:
    order = {rid: k for k, rid in enumerate(r for p in request.pools for r in replica_ids(p))}
    order.update({rid: len(order) + k for k, rid in enumerate(
        r for p in request.pools for r in request.replica_ids(p) if r not in order)})
    placements.sort(key=lambda p: order[p.replica_id])
    placements = with_expert_maps(request.topology, request, placements)
    return PlacementPlan(
        policy=name, topology_fingerprint=request.topology.fingerprint(), placements=tuple(placements),
        unplaced=unplaced_summary(missing), score=score(request.topology, request, placements),
        reasons=tuple(reasons), pools=request.pools, slo_classes=dict(request.slo_classes),
        cross_domain_ep=cross_domain_ep(layout or Layout(request.topology), request.occupied, placements)
        if any(p.expert_parallel for p in request.pools) else 0,
        pp_boundaries=pp_boundaries(request.topology, placements),
    )


def healthy_refs(topology: Topology) -> list[GpuRef]:
    return [GpuRef(n.name, g.index) for n in topology.nodes for g in n.gpus if g.healthy]
