"""Free GPUs per island, and carving TP groups out of an island without stranding GPUs.

Islands with the same shape (members, NUMA layout, cliques, health) and the same free GPUs
are interchangeable, so the policy looks at one representative per signature and caches the
group it would carve: a 1,024-node cluster has a few dozen signatures, not a thousand islands.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from topology import GpuRef, Island, Topology
from topology.islands import joined, maximal_cliques

Positions = frozenset[int]


@dataclass(frozen=True, slots=True)
class Shape:
    """An island's structure in member positions 0..n-1 (what makes two islands alike)."""

    numa: tuple[tuple[int, int | None], ...]
    """(node ordinal within the island, NUMA node) per position."""
    full: bool
    cliques: tuple[Positions, ...]
    """Maximal cliques (positions) when the island is not fully connected."""
    nic_level: tuple[int, ...] = ()
    """Per position: the best PCIe level to any NIC (PIX > PXB > ... ; 0 without NICs)."""


@dataclass(slots=True)
class IslandSlot:
    index: int
    island: Island
    members: tuple[GpuRef, ...]
    shape: Shape
    quality: float
    health: float
    free: Positions


def _shape(topology: Topology, isl: Island, members: Sequence[GpuRef]) -> Shape:
    nodes = {n: k for k, n in enumerate(sorted({m.node for m in members}))}
    numa = tuple((nodes[m.node], topology.gpu(m).numa_node) for m in members)
    near = tuple(max((int(nic.level_to(m.index) or 0) for nic in topology.node(m.node).nics), default=0)
                 for m in members)
    if isl.fully_connected:
        return Shape(numa=numa, full=True, cliques=(), nic_level=near)
    pos = {m: k for k, m in enumerate(members)}
    adj = {m: {o for o in members if o != m and joined(topology, m, o)} for m in members}
    cliques = tuple(sorted(frozenset(pos[g] for g in c) for c in maximal_cliques(adj)) or ())
    return Shape(numa=numa, full=False, cliques=tuple(sorted(cliques, key=sorted)), nic_level=near)


def _health(topology: Topology, members: Sequence[GpuRef]) -> float:
    """Worst GPU-fabric link touching any member, including links to GPUs that left the island
    (a node whose GPU3 is replaying is not where the strictest class should live)."""
    worst = 1.0
    mine = set(members)
    for node in {m.node for m in members}:
        for link in topology.node(node).links:
            if link.kind.is_gpu_fabric and (GpuRef(node, link.a) in mine or GpuRef(node, link.b) in mine):
                worst = min(worst, link.health.score)
    return worst


_STATIC: dict[int, tuple[Island, tuple[GpuRef, ...], Shape, float, float]] = {}


def _static(topology: Topology, isl: Island) -> tuple[tuple[GpuRef, ...], Shape, float, float]:
    """Members, shape, quality, health of an island: cached per island object, which the
    topology layer reuses for unchanged nodes (so a re-plan does not recompute them)."""
    hit = _STATIC.get(id(isl))
    if hit is not None and hit[0] is isl:
        return hit[1], hit[2], hit[3], hit[4]
    members = tuple(g for g in isl.gpus if topology.gpu(g).healthy)
    health = _health(topology, members) if members else 0.0
    quality = (isl.bottleneck_gb_s if isl.size > 1 else 0.0) * health
    shape = _shape(topology, isl, members)
    if len(isl.nodes) == 1:  # multi-node islands depend on several nodes: not cached
        _STATIC[id(isl)] = (isl, members, shape, quality, health)
        if len(_STATIC) > 65536:
            _STATIC.pop(next(iter(_STATIC)))
    return members, shape, quality, health


def build_slots(topology: Topology, islands: Sequence[Island],
                occupied: frozenset[GpuRef] = frozenset()) -> list[IslandSlot]:
    slots = []
    for k, isl in enumerate(islands):
        members, shape, quality, health = _static(topology, isl)
        if not members:
            continue
        free = frozenset(p for p, m in enumerate(members) if m not in occupied) if occupied else \
            frozenset(range(len(members)))
        slots.append(IslandSlot(index=k, island=isl, members=members, shape=shape, quality=quality,
                                health=health, free=free))
    return slots


def _numa_spread(shape: Shape, group: Positions) -> int:
    return len({shape.numa[p] for p in group})


def _largest_clique_left(shape: Shape, free: Positions) -> int:
    if shape.full:
        return len(free)
    return max((len(c & free) for c in shape.cliques), default=min(len(free), 1))


def _candidates(shape: Shape, free: Positions, tp: int) -> list[Positions]:
    """Groups of `tp` free positions that are pairwise joined, a few per NUMA arrangement."""
    pools = [free] if shape.full else [c & free for c in shape.cliques]
    out: set[Positions] = set()
    for pool in pools:
        if len(pool) < tp:
            continue
        ordered = sorted(pool, key=lambda p: (shape.numa[p], p))
        by_numa: dict[tuple[int, int | None], list[int]] = {}
        for p in ordered:
            by_numa.setdefault(shape.numa[p], []).append(p)
        # Within one NUMA node where possible, preferring the fullest-fitting NUMA node.
        for members in sorted(by_numa.values(), key=len):
            if len(members) >= tp:
                out.add(frozenset(members[:tp]))
                out.add(frozenset(members[-tp:]))
        for start in range(0, len(ordered) - tp + 1):
            out.add(frozenset(ordered[start : start + tp]))
    return sorted(out, key=sorted)


@cache
def carve(shape: Shape, free: Positions, tp: int) -> Positions | None:
    """The group that keeps the island most useful: the largest clique left, then one NUMA
    node, then the best-fitting NUMA node, then the lowest positions."""
    best: tuple[tuple[int, int, int, int, list[int]], Positions] | None = None
    for group in _candidates(shape, free, tp):
        left = free - group
        nic_distance = -sum(shape.nic_level[p] for p in group) if shape.nic_level else 0
        key = (-_largest_clique_left(shape, left), _numa_spread(shape, group), nic_distance,
               len([p for p in left if shape.numa[p] in {shape.numa[g] for g in group}]), sorted(group))
        if best is None or key < best[0]:
            best = (key, group)
    return None if best is None else best[1]


@cache
def carve_many(shape: Shape, free: Positions, tps: tuple[int, ...]) -> tuple[Positions, ...] | None:
    """Several groups at once (a prefill replica and its decodes), largest first."""
    groups: list[Positions] = []
    left = free
    for tp in sorted(tps, reverse=True):
        g = carve(shape, left, tp)
        if g is None:
            return None
        groups.append(g)
        left = left - g
    order = sorted(range(len(tps)), key=lambda i: -tps[i])
    out: list[Positions] = [frozenset()] * len(tps)
    for slot, g in zip(order, groups, strict=True):
        out[slot] = g
    return tuple(out)
