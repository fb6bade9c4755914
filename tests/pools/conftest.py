"""The pools' test kit: what placement is checked against (a brute-force search for an in-island
assignment, which the policies must find whenever one exists)."""

from __future__ import annotations

from itertools import combinations

from topology import GpuRef, Topology
from topology.islands import joined


def feasible_in_island(topology: Topology, tps: list[int]) -> bool:
    """Brute force: can every replica get a pairwise-joined group of healthy GPUs?"""
    free = frozenset(r for r in topology.gpu_refs() if topology.gpu(r).healthy)
    memo: dict[tuple[frozenset[GpuRef], int], bool] = {}

    def go(free: frozenset[GpuRef], i: int) -> bool:
        if i == len(tps):
            return True
        if (free, i) in memo:
            return memo[(free, i)]
        ok = False
        for group in combinations(sorted(free), tps[i]):
            if all(joined(topology, a, b) for a, b in combinations(group, 2)) and go(free - set(group), i + 1):
                ok = True
                break
        memo[(free, i)] = ok
        return ok

    return go(free, 0)
