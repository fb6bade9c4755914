"""What users get today, modelled faithfully so the comparison is fair.

- `ray-pack`: Ray's default PACK placement group: replicas in the order declared, each on the
  first node with room, GPUs handed out in index order (Ray fills CUDA_VISIBLE_DEVICES
  lowest-first); when no node has room, the bundles spill over several nodes. Ray knows GPU
  counts, not islands.
- `spread`: Ray's SPREAD: a replica's bundles go to different nodes, round robin.
- `first-fit`: first node with room, lowest indices, never spans nodes.
- `random`: a random node with room and random GPUs on it (seeded).

None of them sees links or their health; all skip GPUs that fell off the bus (a node would
not report them) and replicas whose weights do not fit.

Gangs (dp x pp TP groups): `ray-pack` takes the whole gang as one PACK placement group of
tp x pp x dp bundles (Ray Serve LLM's one placement group per DP/PP engine group); the others
place its TP groups one by one by their own rule. Ranks follow the order the GPUs were handed
out.
"""

from __future__ import annotations

import random

from pools.model import PlacementPlan, PlacementRequest, ReplicaPlacement
from pools.placement.layout import Layout, Work, finish, memory_fits, replicas_in_order
from topology import GpuRef


def _free(request: PlacementRequest) -> dict[str, list[int]]:
    taken = request.occupied
    return {n.name: sorted(g.index for g in n.gpus if g.healthy and GpuRef(n.name, g.index) not in taken)
            for n in request.topology.nodes}


def _take(free: dict[str, list[int]], node: str, indices: list[int]) -> list[GpuRef]:
    for i in indices:
        free[node].remove(i)
    return [GpuRef(node, i) for i in indices]


class _Baseline:
    name = ""
    island_aware = False

    def place(self, request: PlacementRequest) -> PlacementPlan:
        layout = Layout(request.topology)
        free = _free(request)
        rng = random.Random(request.seed)
        placements: list[ReplicaPlacement] = []
        missing: list[tuple[Work, str]] = []
        for k, work in enumerate(replicas_in_order(request, sort=False)):
            groups = self.choose_gang(work, free, k, rng) if work.pool.is_gang else None
            refs = [r for g in groups for r in g] if groups is not None else \
                None if work.pool.is_gang else self.choose(work.pool.tp, free, k, rng)
            if refs is None:
                missing.append((work, f"no node has {work.pool.tp} free GPUs" if not work.pool.is_gang else
                                f"not {work.pool.gang_size} free GPUs in TP groups of {work.pool.tp}"))
                continue
            why = [f"{self.name}: {self.describe()}"]
            placement = layout.gang_placement(work, groups, why) if groups is not None else \
                layout.placement(work, refs, why)
            problem = None
            if not memory_fits(request.topology, work.pool, refs):
                problem = f"{work.pool.model} does not fit in GPU memory at tp={work.pool.tp}"
            elif work.pool.require_island and not placement.in_island:
                problem = f"the {self.name} group crosses islands and the pool requires one"
            elif work.pool.require_domain and not placement.in_domain:
                problem = f"the {self.name} gang spans NVLink domains and the pool requires one"
            if problem is not None:
                for r in refs:
                    free[r.node].append(r.index)
                    free[r.node].sort()
                missing.append((work, problem))
                continue
            placements.append(placement)
        return finish(self.name, request, placements, missing, layout=layout)

    def describe(self) -> str:
        return ""

    def choose(self, size: int, free: dict[str, list[int]], k: int, rng: random.Random) -> list[GpuRef] | None:
        raise NotImplementedError

    def choose_gang(self, work: Work, free: dict[str, list[int]], k: int, rng: random.Random
                    ) -> list[list[GpuRef]] | None:
        """The gang's TP groups, each chosen by the policy's own rule; None (nothing taken) when
        one does not fit."""
        groups: list[list[GpuRef]] = []
        for _ in range(work.pool.dp * work.pool.pp):
            refs = self.choose(work.pool.tp, free, k, rng)
            if refs is None:
                for r in (r for g in groups for r in g):
                    free[r.node].append(r.index)
                    free[r.node].sort()
                return None
            groups.append(refs)
        return groups


class RayPack(_Baseline):
    name = "ray-pack"

    def describe(self) -> str:
        return "first node with room, GPUs in index order"

    def choose_gang(self, work: Work, free: dict[str, list[int]], k: int, rng: random.Random
                    ) -> list[list[GpuRef]] | None:
        refs = self.choose(work.pool.gang_size, free, k, rng)
        if refs is None:
            return None
        t = work.pool.tp
        return [refs[i:i + t] for i in range(0, len(refs), t)]

    def choose(self, size: int, free: dict[str, list[int]], k: int, rng: random.Random) -> list[GpuRef] | None:
        t = size
        for node, gpus in free.items():
            if len(gpus) >= t:
                return _take(free, node, gpus[:t])
        if sum(len(g) for g in free.values()) < t:
            return None
        refs: list[GpuRef] = []
        for node in sorted(free, key=lambda n: -len(free[n])):  # spill: as few nodes as possible
            take = free[node][: t - len(refs)]
            refs.extend(_take(free, node, list(take)))
            if len(refs) == t:
                break
        return refs


class Spread(_Baseline):
    name = "spread"

    def describe(self) -> str:
        return "bundles on different nodes, round robin"

    def choose(self, size: int, free: dict[str, list[int]], k: int, rng: random.Random) -> list[GpuRef] | None:
        t = size
        if sum(len(g) for g in free.values()) < t:
            return None
        nodes = list(free)
        refs: list[GpuRef] = []
        start = k % len(nodes)
        step = 0
        while len(refs) < t:
            node = nodes[(start + step) % len(nodes)]
            step += 1
            if free[node]:
                refs.extend(_take(free, node, [free[node][0]]))
        return refs


class FirstFit(_Baseline):
    name = "first-fit"

    def describe(self) -> str:
        return "first node with room, lowest indices"

    def choose(self, size: int, free: dict[str, list[int]], k: int, rng: random.Random) -> list[GpuRef] | None:
        for node, gpus in free.items():
            if len(gpus) >= size:
                return _take(free, node, gpus[:size])
        return None


class RandomPolicy(_Baseline):
    name = "random"

    def describe(self) -> str:
        return "random node with room, random GPUs (seeded)"

    def choose(self, size: int, free: dict[str, list[int]], k: int, rng: random.Random) -> list[GpuRef] | None:
        nodes = [n for n, g in free.items() if len(g) >= size]
        if not nodes:
            return None
        node = rng.choice(nodes)
        return _take(free, node, sorted(rng.sample(free[node], size)))
