"""Acting on a decision with the topology in mind (pure: plans in, plans out).

    scale out   new replicas are placed by a placement policy on the GPUs no replica holds
                (`island-aligned`: TP groups inside islands, gangs as units, best fit first, so
                a new replica fills the islands its pool's peers already use before opening
                another; a prefill or decode replica goes next to its PD partners first, so
                its KV cache crosses NVLink, else PCIe; the topology-blind autoscaler passes
                `first-fit`)
    scale in    the replica whose removal costs least goes first: one already draining, then
                the worst tier (its TP group or gang on the slowest links), the least healthy
                links, the fewest requests in flight; it drains (no stream is cut) and its
                GPUs return to the plan when it is empty
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from pools.model import PlacementPlan, PlacementRequest, ReplicaPlacement
from pools.placement import get_policy
from topology import GpuRef, Topology, islands
from topology.paths import TIERS


@dataclass(frozen=True, slots=True, kw_only=True)
class Removable:
    replica_id: str
    tier: str
    health_score: float = 1.0
    inflight: int = 0
    draining: bool = False


def removal_order(candidates: Sequence[Removable]) -> list[str]:
    """Which replica of a pool to take away first (module docstring)."""
    def key(c: Removable) -> tuple[bool, int, float, int, str]:
        rank = TIERS.index(c.tier) if c.tier in TIERS else len(TIERS)
        return (not c.draining, -rank, c.health_score, c.inflight, c.replica_id)

    return [c.replica_id for c in sorted(candidates, key=key)]


def scale_out(plan: PlacementPlan, topology: Topology, pool: str, count: int, policy: str,
              held: frozenset[GpuRef] = frozenset(), taken: frozenset[str] = frozenset()
              ) -> tuple[list[ReplicaPlacement], int]:
    """Placements for `count` more replicas of `pool` on the free GPUs (and how many could not be
    placed), by `policy`; the plan's other replicas stay where they are. `held`: GPUs of replicas
    that left the plan but still drain; `taken`: their ids (a new replica never reuses one).

    An island-aware policy places a prefill or decode replica next to its PD partners first: in
    an island that holds one of them (the KV cache crosses NVLink), else on a node that does
    (PCIe), and only then anywhere, by the policy's own preferences inside each region."""
    spec = plan.pool(pool)
    occupied = frozenset(GpuRef(n, g) for p in plan.placements for n, g in p.gpu_refs()) | held
    ids = plan.new_ids(pool, count, taken)
    chosen = get_policy(policy)
    regions: list[frozenset[GpuRef] | None] = [*(_near_partners(plan, topology, pool) if chosen.island_aware
                                                 else []), None]
    placed: list[ReplicaPlacement] = []
    for region in regions:
        left = count - len(placed)
        if left <= 0:
            break
        blocked = occupied | {GpuRef(n, g) for p in placed for n, g in p.gpu_refs()}
        if region is not None:
            blocked |= frozenset(topology.gpu_refs()) - region
        request = PlacementRequest(topology=topology, pools=(replace(spec, replicas=left),),
                                   slo_classes=plan.slo_classes, occupied=blocked,
                                   ids={pool: ids[len(placed):]})
        fresh = [p for p in chosen.place(request).placements if p.pool == pool]
        placed += [p for p in fresh if region is None or p.in_island]
    return placed, count - len(placed)


def _near_partners(plan: PlacementPlan, topology: Topology, pool: str) -> list[frozenset[GpuRef]]:
    """The GPUs of the islands, then of the nodes, that hold a replica of the pool's PD partners
    (the other phase of its model); none for a mixed pool or one without partners."""
    spec = plan.pool(pool)
    other = {"prefill": "decode", "decode": "prefill"}.get(spec.role)
    partners = {p.name for p in plan.pools if p.role == other and p.model == spec.model}
    refs = {GpuRef(n, g) for p in plan.placements if p.pool in partners for n, g in p.gpu_refs()}
    if not refs:
        return []
    near_islands = frozenset(g for i in islands(topology) if refs & set(i.gpus) for g in i.gpus)
    nodes = {r.node for r in refs}
    near_nodes = frozenset(r for r in topology.gpu_refs() if r.node in nodes)
    return [near_islands, near_nodes]


def removable(plan: PlacementPlan, pool: str, inflight: Mapping[str, int], health: Mapping[str, float],
              draining: frozenset[str] = frozenset()) -> list[Removable]:
    return [Removable(replica_id=p.replica_id, tier=p.tier, health_score=health.get(p.replica_id, 1.0),
                      inflight=inflight.get(p.replica_id, 0), draining=p.replica_id in draining)
            for p in plan.placements if p.pool == pool]


def with_count(plan: PlacementPlan, pool: str, placements: tuple[ReplicaPlacement, ...]) -> PlacementPlan:
    """The plan with these placements, the pool's replica count following them (a re-plan then
    keeps what the autoscaler decided)."""
    count = sum(1 for p in placements if p.pool == pool)
    return replace(plan, placements=placements,
                   pools=tuple(replace(p, replicas=count) if p.name == pool else p for p in plan.pools))


def grow(plan: PlacementPlan, topology: Topology, pool: str, count: int, policy: str,
         holding: Sequence[ReplicaPlacement] = ()) -> tuple[PlacementPlan, list[ReplicaPlacement], int]:
    """`scale_out` into the plan: (the new plan, the new placements, how many found no room);
    `holding`: replicas outside the plan that still hold their GPUs and ids (draining, starting)."""
    held = frozenset(GpuRef(n, g) for p in holding for n, g in p.gpu_refs())
    placed, missing = scale_out(plan, topology, pool, count, policy, held, frozenset(p.replica_id for p in holding))
    return with_count(plan, pool, (*plan.placements, *placed)), placed, missing


def shrink(plan: PlacementPlan, pool: str, count: int, inflight: Mapping[str, int], health: Mapping[str, float],
           draining: frozenset[str] = frozenset()) -> tuple[PlacementPlan, list[str]]:
    """The `count` replicas of `pool` whose removal costs least (`removal_order`) out of the plan:
    (the new plan, their ids)."""
    gone = removal_order(removable(plan, pool, inflight, health, draining))[:count]
    return with_count(plan, pool, tuple(p for p in plan.placements if p.replica_id not in gone)), gone
