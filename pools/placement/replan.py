"""Incremental re-plan: after a link goes down, a node goes away or a node arrives, move as few
replicas as possible and say which.

A placement stays when its GPUs still exist and are healthy, its group is still what its pool
and policy require (inside one island, no unhealthy link inside), and the model still fits.
Only the others move, placed by the same policy on the GPUs nobody kept; replicas that were
unplaced get another chance (a new node may hold them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from pools.model import DEFAULT_SLO_CLASSES, PlacementPlan, PlacementRequest, ReplicaPlacement
from pools.placement import get_policy
from pools.placement.layout import Layout, Work, finish
from pools.placement.validate import group_problems, tp_groups
from topology import GpuRef, Island, Topology, is_clique, islands
from topology.islands import island_of


@dataclass(frozen=True, slots=True, kw_only=True)
class Move:
    replica_id: str
    before: str
    after: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Replan:
    plan: PlacementPlan
    moves: tuple[Move, ...]
    kept: int


def _where(p: ReplicaPlacement | None) -> str:
    if p is None:
        return "unplaced"
    return ",".join(f"{n}:{'/'.join(str(g) for g in gpus)}" for n, gpus in
                    [(p.node, p.gpus), *p.extra_nodes])


def _why_invalid(old: PlacementPlan, topology: Topology, p: ReplicaPlacement, island_aware: bool) -> str | None:
    """Why a placement must move (a gang moves as a unit: any rank's problem moves it all)."""
    refs = [GpuRef(n, g) for n, g in p.gpu_refs()]
    groups = tp_groups(p) if p.members else None
    problems = group_problems(topology, old.pool(p.pool), refs, island_aware, groups)
    if problems:
        return problems[0]
    if island_aware and p.in_island and any(len(g) > 1 and not is_clique(topology, g) for g in (groups or [refs])):
        return "its GPUs are no longer joined by healthy NVLink/XGMI (the island split)"
    if island_aware and p.members and p.expert_parallel and p.in_domain and len(
            {island.id for island in islands_of(topology, refs)}) > 1:
        return "its NVLink domain split (a link inside it went unhealthy): the all-to-all would cross the network"
    return None


def islands_of(topology: Topology, refs: list[GpuRef]) -> list[Island]:
    where = island_of(islands(topology))
    return [where[r] for r in refs]


def _refresh(layout: Layout, p: ReplicaPlacement, old: PlacementPlan) -> ReplicaPlacement:
    work = Work(replica_id=p.replica_id, pool=old.pool(p.pool), strictness=0.0)
    if p.members:
        return layout.gang_placement(work, tp_groups(p), p.reasons)
    return layout.placement(work, [GpuRef(n, g) for n, g in p.gpu_refs()], p.reasons)


def replan(old: PlacementPlan, topology: Topology, seed: int = 0, previous: Topology | None = None,
           held: Sequence[ReplicaPlacement] = (), evict: Mapping[str, str] | None = None,
           avoid: frozenset[GpuRef] = frozenset()) -> Replan:
    """`previous`, the topology `old` was made for, lets placements on unchanged nodes (the
    same node objects) skip their re-check: the work is proportional to what changed. `held`:
    replicas outside the plan that still run (draining): their GPUs and ids are not given out.
    `evict`: replicas that move whatever their placement (replica id -> why), placed anew off
    the GPUs in `avoid` (`pools.placement.evict`)."""
    evict = evict or {}
    policy = get_policy(old.policy)
    kept: list[ReplicaPlacement] = []
    to_move: dict[str, list[str]] = {}
    reasons: dict[str, str] = {}
    before: dict[str, ReplicaPlacement] = {}
    unchanged = set()
    if previous is not None and previous.fingerprint() == old.topology_fingerprint:
        unchanged = {n.name for n in topology.nodes
                     if previous.has_node(n.name) and previous.node(n.name) is n}
    for p in old.placements:
        same = p.node in unchanged and all(n in unchanged for n, _ in p.extra_nodes)
        why = evict.get(p.replica_id) or (None if same else _why_invalid(old, topology, p, policy.island_aware))
        if why is None:
            kept.append(p)
        else:
            to_move.setdefault(p.pool, []).append(p.replica_id)
            reasons[p.replica_id] = why
            before[p.replica_id] = p
    for pool in old.pools:  # a pool short of its count (ids need not be contiguous: autoscaling removes any)
        short = pool.replicas - sum(1 for p in old.placements if p.pool == pool.name)
        for rid in old.new_ids(pool.name, max(short, 0), (p.replica_id for p in held)):
            to_move.setdefault(pool.name, []).append(rid)
            reasons[rid] = "was unplaced"
    occupied = frozenset(GpuRef(n, g) for p in (*kept, *held) for n, g in p.gpu_refs()) | avoid
    sub_pools = tuple(replace(pool, replicas=len(to_move[pool.name])) for pool in old.pools if pool.name in to_move)
    classes = old.slo_classes or {c.name: c for c in DEFAULT_SLO_CLASSES}
    request = PlacementRequest(topology=topology, pools=sub_pools, seed=seed, occupied=occupied,
                               ids={k: tuple(v) for k, v in to_move.items()}, slo_classes=classes)
    fresh = policy.place(request) if sub_pools else None
    new_placements = list(fresh.placements) if fresh else []
    after = {p.replica_id: p for p in new_placements}
    moves = tuple(
        Move(replica_id=rid, before=_where(before.get(rid)), after=_where(after.get(rid)), reason=reasons[rid])
        for ids in to_move.values() for rid in ids
        if not (reasons[rid] == "was unplaced" and rid not in after)
    )
    full = PlacementRequest(topology=topology, pools=old.pools, seed=seed, slo_classes=classes)
    def touched(p: ReplicaPlacement) -> bool:
        return any(n not in unchanged for n in (p.node, *(x for x, _ in p.extra_nodes)))

    if any(touched(p) for p in kept):
        # island, tier and in-island flag follow the new topology (a kept group may now cross a bad link)
        layout = Layout(topology)
        kept = [_refresh(layout, p, old) if touched(p) else p for p in kept]
    missing = [(Work(replica_id=f"{u.pool}-?", pool=next(p for p in old.pools if p.name == u.pool),
                     strictness=0.0), u.reason) for u in (fresh.unplaced if fresh else ()) for _ in range(u.count)]
    plan = finish(old.policy, full, kept + new_placements, missing,
                  [f"re-plan: kept {len(kept)}, moved {len(moves)}"])
    return Replan(plan=plan, moves=moves, kept=len(kept))
