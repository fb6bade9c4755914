"""Gangs for `island-aligned`: a replica of dp x pp TP groups placed as a unit.

1. Expert-parallel gangs go before every other replica, largest first, so that no small replica
   splits the NVLink domain an EP gang needed (a TP=1 decode on an NVL72 rack would otherwise
   leave it 71). Other gangs (dense data-parallel ranks, pipelines) need a clique per TP group,
   not a domain: the policy tries them first and after the ordinary replicas, and keeps the
   better plan (`island_aligned`).
2. Which gang goes into which domain is searched exactly (depth first, best fit first, with a
   budget): the most EP gangs inside domains, then the most gangs. Inside the domain its TP
   groups are carved as any TP group is (cliques, NUMA, NICs), in GPU order, so consecutive
   ranks and stages are neighbours.
3. A gang no free domain can hold spans the fewest carriers: one node's islands (or, where the
   pool allows TP groups across islands, the node's PCIe groups), or a multi-node NVLink
   domain; first from the rack with room, then from nodes whose GPUs each have a close NIC
   (rail-aligned). Ranks run node by node, so each node's ranks are contiguous, and pipeline
   stages follow that order: stage boundaries fall on island and node edges, never inside a
   TP group, and the fewest cross the network.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pools.model import PoolSpec
from pools.placement.fallback import cross_island_group
from pools.placement.islandstate import IslandSlot, Positions, carve, carve_many
from pools.placement.layout import Work
from topology import GpuRef, LinkKind, Topology

SEARCH_BUDGET = 20000
"""Search steps before the domain assignment settles for the best found (small clusters are
solved exactly)."""
SEARCH_WORK = 2_000_000
"""...and at most this many slot visits in all (each step looks at every island once), so a
thousand-node cluster stops after ~2,000 steps: the first, best-fit path is always tried whole."""


def tps(pool: PoolSpec) -> tuple[int, ...]:
    return (pool.tp,) * (pool.dp * pool.pp)


def describe(pool: PoolSpec) -> str:
    parts = [f"tp={pool.tp}"] + ([f"dp={pool.dp}"] if pool.dp > 1 else []) + ([f"pp={pool.pp}"] if pool.pp > 1 else [])
    kind = "EP gang" if pool.expert_parallel else "gang"
    return f"{kind} of {pool.gang_size} GPUs ({' '.join(parts)})"


Fits = Callable[[PoolSpec, list[GpuRef]], bool]


def _in_order(groups: Sequence[Positions]) -> list[Positions]:
    """TP groups in GPU order: ranks (and stages) go to neighbouring GPUs."""
    return sorted(groups, key=min)


@dataclass(slots=True)
class DomainChoice:
    slot: int
    groups: list[Positions]


class DomainSearch:
    """Gangs to islands: as many gangs inside one island as any assignment can hold."""

    def __init__(self, slots: Sequence[IslandSlot], fits: Fits, key: Callable[[int, int, Work], tuple[object, ...]],
                 signature: Callable[[int, Positions], tuple[object, ...]]) -> None:
        self.slots = slots
        self.fits = fits
        self.key = key
        self.signature = signature
        self.steps = 0

    def _options(self, free: list[Positions], work: Work) -> list[DomainChoice]:
        pool = work.pool
        need = pool.gang_size
        seen: set[tuple[object, ...]] = set()
        found: list[tuple[tuple[object, ...], DomainChoice]] = []
        for k, slot in enumerate(self.slots):
            if len(free[k]) < need:
                continue
            sig = self.signature(k, free[k])
            if sig in seen:
                continue
            seen.add(sig)
            groups = carve_many(slot.shape, free[k], tps(pool))
            if groups is None:
                continue
            ordered = _in_order(groups)
            refs = [slot.members[p] for g in ordered for p in sorted(g)]
            if not self.fits(pool, refs):
                continue
            found.append((self.key(k, len(free[k]) - need, work), DomainChoice(slot=k, groups=ordered)))
        found.sort(key=lambda x: x[0])
        return [c for _, c in found]

    def assign(self, gangs: Sequence[Work]) -> dict[str, DomainChoice]:
        """The assignment holding the most EP gangs inside domains, then the most gangs (EP gangs
        need a domain for their all-to-all; other gangs only want one)."""
        free = [s.free for s in self.slots]
        best: dict[str, DomainChoice] = {}
        best_score = (0, 0)
        chosen: dict[str, DomainChoice] = {}
        ep_left = [0] * (len(gangs) + 1)
        for i in range(len(gangs) - 1, -1, -1):
            ep_left[i] = ep_left[i + 1] + (1 if gangs[i].pool.expert_parallel else 0)
        goal = (ep_left[0], len(gangs))
        self.steps = 0
        budget = max(len(gangs) + 1, min(SEARCH_BUDGET, SEARCH_WORK // max(1, len(self.slots))))

        def walk(i: int, ep_in: int) -> bool:
            nonlocal best, best_score
            self.steps += 1
            score = (ep_in, len(chosen))
            if score > best_score:
                best, best_score = dict(chosen), score
            if best_score == goal:
                return True
            bound = (ep_in + ep_left[i], len(chosen) + len(gangs) - i)
            if i == len(gangs) or bound <= best_score or self.steps > budget:
                return False
            work = gangs[i]
            ep = 1 if work.pool.expert_parallel else 0
            for choice in self._options(free, work):
                taken = frozenset().union(*choice.groups)
                free[choice.slot] = free[choice.slot] - taken
                chosen[work.replica_id] = choice
                done = walk(i + 1, ep_in + ep)
                del chosen[work.replica_id]
                free[choice.slot] = free[choice.slot] | taken
                if done:
                    return True
            return walk(i + 1, ep_in)  # this gang outside any domain

        walk(0, 0)
        return best


@dataclass(slots=True)
class Carrier:
    """GPUs that can take whole TP groups of a spanning gang: one island's (cliques), or a
    node's leftover GPUs grouped across islands (only where the pool allows it)."""

    slot: int | None
    node: str
    """The carrier's first node (its rack and NICs stand for it)."""
    unit: str
    """Carriers of one unit (a node, or a multi-node NVLink domain) are taken together first."""
    groups: list[list[GpuRef]]


def detached_gpus(topology: Topology, slots: Sequence[IslandSlot]) -> frozenset[GpuRef]:
    """GPUs that unhealthy links cut off from their NVLink island (alone now, though they have
    NVLink/XGMI links): a gang spanning domains leaves them out when it can (its all-to-all
    would run over the sick links' fallback)."""
    out = set()
    for slot in slots:
        if slot.island.size == 1:
            ref = slot.island.gpus[0]
            if any(link.kind.is_gpu_fabric and ref.index in (link.a, link.b) for link in topology.node(ref.node).links):
                out.add(ref)
    return frozenset(out)


def carriers(topology: Topology, slots: Sequence[IslandSlot], pool: PoolSpec,
             avoid: frozenset[GpuRef] = frozenset()) -> list[Carrier]:
    out: list[Carrier] = []
    left: dict[str, set[GpuRef]] = {}
    for k, slot in enumerate(slots):
        free = frozenset(p for p in slot.free if slot.members[p] not in avoid) if avoid else slot.free
        groups: list[Positions] = []
        while len(free) >= pool.tp:
            g = carve(slot.shape, free, pool.tp)
            if g is None:
                break
            groups.append(g)
            free = free - g
        refs = [[slot.members[p] for p in sorted(g)] for g in _in_order(groups)]
        nodes = slot.island.nodes
        if refs:
            out.append(Carrier(slot=k, node=nodes[0], unit=slot.island.id if len(nodes) > 1 else nodes[0],
                               groups=refs))
        for p in free:
            left.setdefault(slot.members[p].node, set()).add(slot.members[p])
    if pool.tp > 1 and not pool.require_island:
        for node, gpus in sorted(left.items()):
            groups_x: list[list[GpuRef]] = []
            while len(gpus) >= pool.tp:
                found = cross_island_group(topology, gpus, pool.tp)
                if found is None:
                    break
                group = sorted(found[0])
                groups_x.append(group)
                gpus -= set(group)
            if groups_x:
                out.append(Carrier(slot=None, node=node, unit=node, groups=groups_x))
    return out


def _rail_aligned(topology: Topology, carrier: Carrier) -> bool:
    """Every GPU of the carrier has a NIC under its own PCIe switch or bridge (one rail each)."""
    node = topology.node(carrier.node)
    return all(any(nic.level_to(r.index) in _CLOSE for nic in node.nics)
               for g in carrier.groups for r in g if r.node == carrier.node)


_CLOSE = frozenset({LinkKind.PIX, LinkKind.PXB})


def span(topology: Topology, options: Sequence[Carrier], pool: PoolSpec, fits: Fits
         ) -> tuple[list[list[GpuRef]], list[Carrier]] | None:
    """TP groups for a gang across carriers: the fewest units, from one rack when one has room,
    rail-aligned nodes first; the groups in rank order (unit by unit, node by node)."""
    need = pool.dp * pool.pp
    units: dict[str, list[Carrier]] = {}
    for c in options:
        units.setdefault(c.unit, []).append(c)

    def size(u: str) -> int:
        return sum(len(c.groups) for c in units[u])

    def rack(u: str) -> str:
        return topology.node(units[u][0].node).rack or ""

    def rails(u: str) -> bool:
        return all(_rail_aligned(topology, c) for c in units[u])

    racks: dict[str, list[str]] = {}
    for u in units:
        racks.setdefault(rack(u), []).append(u)
    total = {r: sum(size(u) for u in us) for r, us in racks.items()}
    enough = [r for r in racks if total[r] >= need]
    rack_order = sorted(enough, key=lambda r: (_units_needed(sorted(size(u) for u in racks[r]), need), total[r], r)) \
        if enough else sorted(racks, key=lambda r: (-total[r], r))
    picked: list[str] = []
    have = 0
    for r in rack_order:
        ranked = sorted(racks[r], key=lambda u: (not rails(u), -size(u), u))
        for u in ranked:
            if have >= need:
                break
            picked.append(u)
            have += size(u)
        if have >= need:
            break
    if have < need:
        return None
    # Best fit for the last unit: the smallest one in the same rack that still completes the gang.
    last = picked[-1]
    short = need - (have - size(last))
    same_rack = [u for u in racks[rack(last)] if u not in picked and size(u) >= short and rails(u) >= rails(last)]
    if same_rack:
        swap = min(same_rack, key=lambda u: (size(u), u))
        if size(swap) < size(last):
            picked[-1] = swap
    picked.sort(key=lambda u: (rack(u), units[u][0].node, u))
    groups: list[list[GpuRef]] = []
    used: list[Carrier] = []
    for u in picked:
        for c in sorted(units[u], key=lambda c: (c.node, c.groups[0][0])):
            take = c.groups[: need - len(groups)]
            if take:
                groups.extend(take)
                used.append(c)
    refs = [r for g in groups for r in g]
    if not fits(pool, refs):
        return None
    return groups, used


def _units_needed(sizes: list[int], need: int) -> int:
    got = count = 0
    for s in sorted(sizes, reverse=True):
        if got >= need:
            break
        got += s
        count += 1
    return count
