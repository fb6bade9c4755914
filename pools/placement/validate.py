"""`validate_plan(plan, topology)`: the invariants every plan must keep, as a list of
violations (empty when the plan is valid). Every policy test calls it.

- every placement names a pool of the plan, and each pool's placed + unplaced = requested;
- GPUs exist, are healthy, and none is used twice;
- a group has exactly the pool's TP size (a gang: tp x pp x dp GPUs in TP groups of tp), and
  the model fits in each GPU's memory;
- the recorded tier and in-island flag are what the topology says;
- where required — the pool says `require_island`, or the policy promises island alignment —
  the group is inside one island (pairwise NVLink/XGMI), and no unhealthy link is inside it;
  an island-aware policy may cross islands only for a pool that allows it.
"""

from __future__ import annotations

from itertools import combinations

from pools.model import PlacementPlan, PoolSpec, ReplicaPlacement
from pools.placement import get_policy
from pools.placement.layout import memory_fits
from topology import GpuRef, Island, Topology, is_clique, islands, tier
from topology.islands import island_of


def _unhealthy_inside(topology: Topology, refs: list[GpuRef]) -> list[str]:
    bad = []
    for a, b in combinations(refs, 2):
        if a.node == b.node:
            link = topology.node(a.node).link(a.index, b.index)
            if link is not None and not link.health.healthy:
                bad.append(f"{a}-{b}")
    return bad


def tp_groups(pl: ReplicaPlacement) -> list[list[GpuRef]]:
    """A placement's TP groups: its one group, or a gang's per (stage, DP rank)."""
    if not pl.members:
        return [[GpuRef(n, g) for n, g in pl.gpu_refs()]]
    groups: dict[tuple[int, int], list[GpuRef]] = {}
    for m in pl.members:
        groups.setdefault((m.pp_stage, m.dp_rank_start), []).extend(GpuRef(m.node, g) for g in m.gpus)
    return [groups[k] for k in sorted(groups)]


def group_problems(topology: Topology, pool: PoolSpec, refs: list[GpuRef], island_aware: bool,
                   groups: list[list[GpuRef]] | None = None) -> list[str]:
    """What is wrong with this group for this pool (GPUs gone or sick, size, memory, island, links);
    for a gang, `groups` are its TP groups, each checked as a TP group."""
    out = []
    for r in refs:
        if not topology.has_node(r.node):
            return [f"node {r.node} is gone"]
        if not topology.node(r.node).has_gpu(r.index):
            return [f"{r} does not exist"]
        if not topology.gpu(r).healthy:
            out.append(f"{r} is unhealthy ({'; '.join(topology.gpu(r).health_reasons)})")
    if out:
        return out
    groups = groups or [refs]
    if len(refs) != pool.gang_size:
        out.append(f"{len(refs)} GPUs for tp={pool.tp}" + (f" x pp={pool.pp} x dp={pool.dp}" if pool.is_gang else ""))
    if pool.is_gang and (len(groups) != pool.dp * pool.pp or any(len(g) != pool.tp for g in groups)):
        out.append(f"TP groups of {sorted(len(g) for g in groups)} GPUs, want {pool.dp * pool.pp} of {pool.tp}")
    if not memory_fits(topology, pool, refs):
        out.append(f"{pool.model} does not fit at tp={pool.tp}")
    for group in groups:
        in_island = len(group) == 1 or is_clique(topology, group)
        if pool.require_island and not in_island:
            out.append(f"pool {pool.name} requires one island, group crosses islands")
        if island_aware or pool.require_island:
            bad = _unhealthy_inside(topology, group)
            if bad:
                out.append(f"unhealthy link inside the TP group ({', '.join(bad)})")
            if len({r.node for r in group}) > 1 and not in_island:
                out.append("TP group spans nodes outside an NVLink domain")
    return out


def _recorded(topology: Topology, pl: ReplicaPlacement, refs: list[GpuRef], where: dict[GpuRef, Island]) -> list[str]:
    """What the placement says about itself must be what the topology says."""
    out = []
    actual_in = all(len(g) == 1 or is_clique(topology, g) for g in tp_groups(pl))
    if actual_in != pl.in_island:
        out.append(f"recorded in_island={pl.in_island}, topology says {actual_in}")
    if pl.members and pl.in_domain != (len({where[r].id for r in refs}) == 1):
        out.append(f"recorded in_domain={pl.in_domain}, topology says otherwise")
    if tier(topology, refs) != pl.tier:
        out.append(f"recorded tier {pl.tier}, topology says {tier(topology, refs)}")
    label = "+".join(sorted({where[r].id for r in refs}))
    if pl.island != label:
        out.append(f"recorded island {pl.island}, topology says {label}")
    return out


def validate_plan(plan: PlacementPlan, topology: Topology) -> list[str]:
    problems: list[str] = []
    where = island_of(islands(topology))
    pools = {p.name: p for p in plan.pools}
    island_aware = get_policy(plan.policy).island_aware if plan.policy else False
    used: dict[GpuRef, str] = {}
    placed: dict[str, int] = {}
    seen_ids: set[str] = set()
    for pl in plan.placements:
        pool = pools.get(pl.pool)
        if pool is None:
            problems.append(f"{pl.replica_id}: unknown pool {pl.pool}")
            continue
        if pl.replica_id in seen_ids:
            problems.append(f"{pl.replica_id}: replica id used twice")
        seen_ids.add(pl.replica_id)
        if pl.role != pool.role:
            problems.append(f"{pl.replica_id}: role {pl.role}, pool {pool.name} is {pool.role}")
        placed[pl.pool] = placed.get(pl.pool, 0) + 1
        refs = [GpuRef(n, g) for n, g in pl.gpu_refs()]
        found = group_problems(topology, pool, refs, island_aware, tp_groups(pl) if pl.members else None)
        problems.extend(f"{pl.replica_id}: {p}" for p in found)
        if any(p.endswith(("is gone", "does not exist")) for p in found):
            continue
        problems.extend(f"{pl.replica_id}: {p}" for p in _recorded(topology, pl, refs, where))
        if pool.require_domain and len({where[r].id for r in refs}) > 1:
            problems.append(f"{pl.replica_id}: pool {pool.name} requires one NVLink domain, the gang spans several")
        for r in refs:
            if r in used:
                problems.append(f"{pl.replica_id}: {r} already used by {used[r]}")
            used[r] = pl.replica_id
    for u in plan.unplaced:
        if u.count < 1:
            problems.append(f"unplaced {u.pool}: count {u.count}")
        placed[u.pool] = placed.get(u.pool, 0) + u.count
    for name, pool in pools.items():
        if placed.get(name, 0) != pool.replicas:
            problems.append(f"pool {name}: {placed.get(name, 0)} placed or unplaced of {pool.replicas} requested")
    if plan.topology_fingerprint != topology.fingerprint():
        problems.append("plan was made for another topology (fingerprint differs)")
    return problems
