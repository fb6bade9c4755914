"""The last resort of `island-aligned`: a group that must cross islands (a PCIe-only box, TP
larger than any island), kept on one node, on one NUMA node when possible, and never over an
unhealthy link. Cross-node TP is never chosen: an all-reduce per layer over the network costs
more than the replica is worth."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from topology import GpuRef, Topology, tier
from topology.paths import TIERS


def _unhealthy_pair(topology: Topology, a: GpuRef, b: GpuRef) -> bool:
    link = topology.node(a.node).link(a.index, b.index)
    return link is not None and not link.health.healthy


def _group(topology: Topology, candidates: list[GpuRef], tp: int) -> list[GpuRef] | None:
    """Greedy in the given order, skipping GPUs with an unhealthy link to one already chosen."""
    chosen: list[GpuRef] = []
    for g in candidates:
        if all(not _unhealthy_pair(topology, g, c) for c in chosen):
            chosen.append(g)
            if len(chosen) == tp:
                return chosen
    return None


def cross_island_group(topology: Topology, free: Iterable[GpuRef], tp: int,
                       fits: Callable[[list[GpuRef]], bool] = lambda refs: True) -> tuple[list[GpuRef], str] | None:
    by_node: dict[str, list[GpuRef]] = {}
    for g in sorted(free):
        by_node.setdefault(g.node, []).append(g)
    best: tuple[tuple[int, int, str], list[GpuRef]] | None = None
    for node, gpus in by_node.items():
        if len(gpus) < tp:
            continue
        by_numa: dict[int | None, list[GpuRef]] = {}
        for g in gpus:
            by_numa.setdefault(topology.gpu(g).numa_node, []).append(g)
        orders = [members + [g for g in gpus if g not in members]
                  for members in sorted(by_numa.values(), key=lambda m: (len(m) < tp, len(m)))]
        for order in orders:
            group = _group(topology, order, tp)
            if group is None or not fits(group):
                continue
            key = (TIERS.index(tier(topology, group)), len(gpus) - tp, node)
            if best is None or key < best[0]:
                best = (key, group)
    if best is None:
        return None
    group = best[1]
    return group, f"crosses islands on {group[0].node} over {tier(topology, group)} (pool allows it)"
