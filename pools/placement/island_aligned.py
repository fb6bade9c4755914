"""`island-aligned`: every TP group inside one island, PD pairs sharing an island, strict SLO
classes on the best and healthiest islands, and no GPU stranded by careless packing.

Why not greedy first-come-first-served: placing replicas in the order they are declared lets
a TP=1 replica split the only NVLink pair a later TP=2 replica needed (index order does
exactly that on bridge machines). Instead:

1. Replicas go strictest SLO class first, then largest TP first (first-fit decreasing; TP
   sizes are powers of two, for which decreasing order packs without waste).
2. A prefill pool and a decode pool of the same model form units (one prefill and its share
   of decodes); a unit is placed in one island when one can hold it, so KV moves over NVLink;
   otherwise its members go individually, decodes preferring the prefill's node.
3. For each replica the candidate islands are those that can carve a pairwise-joined group of
   healthy GPUs (a clique on mesh machines like the DGX-1). The strictest pools take the
   best islands (bottleneck bandwidth x health), the most lenient ones the worst that fit,
   and ties go to the island left with the fewest free GPUs (best fit).
4. Inside the island the group keeps the largest clique free, stays on one NUMA node, prefers
   GPUs with a NIC at PIX/PXB distance, and fills the fuller NUMA node first (islandstate.carve).
5. A replica that no island can hold crosses islands only if its pool allows it, on one node,
   on one NUMA node when possible, never over an unhealthy link; otherwise it is unplaced with
   the reason.
6. Gangs (data-parallel ranks, expert parallelism, pipeline stages) go first, as units
   (`pools.placement.gangs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pools.model import PlacementPlan, PlacementRequest, PoolSpec, ReplicaPlacement
from pools.placement.fallback import cross_island_group
from pools.placement.gangs import DomainSearch, carriers, describe, detached_gpus, span
from pools.placement.islandstate import IslandSlot, Positions, build_slots, carve_many
from pools.placement.layout import Layout, Work, finish, gpu_memory_gb, memory_fits, replicas_in_order
from topology import GpuRef


@dataclass(slots=True)
class _Unit:
    members: list[Work]
    strictness: float


def _pd_partners(pools: Sequence[PoolSpec]) -> dict[str, str]:
    """prefill pool -> decode pool of the same model sharing an SLO class (first match)."""
    out: dict[str, str] = {}
    decodes = [p for p in pools if p.role == "decode" and not p.is_gang]
    for p in pools:
        if p.role != "prefill" or p.is_gang:
            continue
        for d in decodes:
            shares = not p.slo_classes or not d.slo_classes or set(p.slo_classes) & set(d.slo_classes)
            if d.model == p.model and shares and d.name not in out.values():
                out[p.name] = d.name
                break
    return out


def _units(request: PlacementRequest, pd_units: bool = True) -> list[_Unit]:
    work = [w for w in replicas_in_order(request, sort=True) if not w.pool.is_gang]
    by_pool: dict[str, list[Work]] = {}
    for w in work:
        by_pool.setdefault(w.pool.name, []).append(w)
    partners = {p: d for p, d in _pd_partners(request.pools).items() if by_pool.get(p) and by_pool.get(d)} \
        if pd_units else {}
    paired = set(partners) | set(partners.values())
    units: list[_Unit] = []
    for prefill, decode in partners.items():
        ps, ds = by_pool[prefill], by_pool[decode]
        for i, p in enumerate(ps):
            lo, hi = round(i * len(ds) / len(ps)), round((i + 1) * len(ds) / len(ps))
            members = [p, *ds[lo:hi]]
            units.append(_Unit(members=members, strictness=max(m.strictness for m in members)))
    units.extend(_Unit(members=[w], strictness=w.strictness) for w in work if w.pool.name not in paired)
    units.sort(key=lambda u: (-u.strictness, -sum(m.pool.tp for m in u.members)))
    return units


class IslandAligned:
    name = "island-aligned"
    island_aware = True

    def place(self, request: PlacementRequest) -> PlacementPlan:
        plan = _Run(request, pd_units=True).run()
        if (plan.unplaced or plan.cross_island_tp_groups) and _pd_partners(request.pools):
            # Keeping PD pairs together can use up the one island a large TP group needed:
            # then plain first-fit decreasing may place more, inside islands.
            alone = _Run(request, pd_units=False).run()
            if _quality(alone) > _quality(plan):
                plan = alone
        if (plan.unplaced or plan.cross_island_tp_groups) and any(
                p.is_gang and not p.expert_parallel for p in request.pools):
            # A dense gang placed first may take the island an ordinary TP group needed: its TP
            # groups only need cliques, so placing it after the ordinary replicas may do better.
            later = _Run(request, pd_units=True, dense_gangs_first=False).run()
            if _quality(later) > _quality(plan):
                plan = later
        return plan


def _quality(plan: PlacementPlan) -> tuple[int, int, int, int, float]:
    """Better plans leave fewer GPUs' worth of replicas unplaced (a 16-GPU gang weighs 16; of
    those, fewer in gangs: a gang is all or nothing), then fewer EP gangs across domains, fewer
    TP groups across islands, then score."""
    unplaced = sum(u.count * plan.pool(u.pool).gang_size for u in plan.unplaced)
    gangs = sum(u.count * plan.pool(u.pool).gang_size for u in plan.unplaced if plan.pool(u.pool).is_gang)
    return (-unplaced, -gangs, -plan.cross_domain_ep_groups, -plan.cross_island_tp_groups, plan.score)


class _Run:
    def __init__(self, request: PlacementRequest, pd_units: bool = True, dense_gangs_first: bool = True) -> None:
        self.request = request
        self.pd_units = pd_units
        self.dense_gangs_first = dense_gangs_first
        self.layout = Layout(request.topology)
        self.slots = build_slots(request.topology, self.layout.islands, request.occupied)
        self.by_sig: dict[tuple[object, ...], set[int]] = {}
        for k, slot in enumerate(self.slots):
            self.by_sig.setdefault(self._sig(slot), set()).add(k)
        self.node_slots: dict[str, list[int]] = {}
        for k, slot in enumerate(self.slots):
            for node in slot.island.nodes:
                self.node_slots.setdefault(node, []).append(k)
        levels = sorted({request.strictness(p) for p in request.pools})
        self.levels = levels
        self.placements: list[ReplicaPlacement] = []
        self.missing: list[tuple[Work, str]] = []
        self.leftover: list[Work] = []

    def _sig(self, slot: IslandSlot) -> tuple[object, ...]:
        memory = gpu_memory_gb(self.request.topology, slot.members[0])
        return (slot.shape, round(slot.quality, 3), slot.free, memory)

    def _preference(self, strictness: float) -> int:
        """+1: wants the best islands; -1: the worst that fit; 0: indifferent."""
        if len(self.levels) < 2:
            return 1
        if strictness >= self.levels[-1]:
            return 1
        return -1 if strictness <= self.levels[0] else 0

    def _take(self, k: int, group: Positions) -> list[GpuRef]:
        slot = self.slots[k]
        self.by_sig[self._sig(slot)].discard(k)
        slot.free = slot.free - group
        self.by_sig.setdefault(self._sig(slot), set()).add(k)
        return [slot.members[p] for p in sorted(group)]

    def _key(self, k: int, pref: int, need: int) -> tuple[float, int, int]:
        slot = self.slots[k]
        return (-pref * slot.quality, len(slot.free) - need, k)

    def _best_slot(self, members: Sequence[Work], pref: int, within: Sequence[int] | None = None
                   ) -> tuple[int, tuple[Positions, ...]] | None:
        tps = tuple(m.pool.tp for m in members)
        need = sum(tps)
        best: tuple[tuple[float, int, int], int, tuple[Positions, ...]] | None = None
        candidates = [min(ks) for ks in self.by_sig.values() if ks] if within is None else within
        for k in candidates:
            slot = self.slots[k]
            if len(slot.free) < need:
                continue
            groups = carve_many(slot.shape, slot.free, tps)
            if groups is None:
                continue
            refs = ([slot.members[p] for p in g] for g in groups)
            if not all(memory_fits(self.request.topology, m.pool, r) for m, r in zip(members, refs, strict=True)):
                continue  # the model does not fit this island's GPUs: look at the others
            key = self._key(k, pref, need)
            if best is None or key < best[0]:
                best = (key, k, groups)
        return None if best is None else (best[1], best[2])

    def _reason(self, k: int, refs: list[GpuRef], extra: str = "") -> list[str]:
        slot = self.slots[k]
        isl = slot.island
        numa = sorted({str(self.request.topology.gpu(r).numa_node) for r in refs})
        kind = isl.kind.label if isl.kind else "single GPU"
        text = (f"inside island {isl.id} ({kind}, bottleneck {isl.bottleneck_gb_s:g} GB/s, health "
                f"{slot.health:.2f}); NUMA {','.join(numa)}; leaves {len(slot.free)} free there")
        return [text + (f"; {extra}" if extra else "")]

    def _place_group(self, members: list[Work], within: Sequence[int] | None) -> bool:
        pref = self._preference(max(m.strictness for m in members))
        found = self._best_slot(members, pref, within)
        if found is None:
            return False
        k, groups = found
        together = len(members) > 1
        for m, g in zip(members, groups, strict=True):
            taken = self._take(k, g)
            extra = f"with {members[0].replica_id}: KV stays in the island" if together and m is not members[0] else ""
            self.placements.append(self.layout.placement(m, taken, self._reason(k, taken, extra)))
        return True

    def _place_unit(self, unit: _Unit) -> None:
        if len(unit.members) > 1 and self._place_group(unit.members, None):
            return
        anchor_node: str | None = None
        for m in sorted(unit.members, key=lambda w: -w.pool.tp):  # split up: largest TP first
            within = self.node_slots.get(anchor_node, []) if anchor_node else None
            if within and self._place_group([m], within):
                continue
            if self._place_group([m], None):
                if anchor_node is None:
                    anchor_node = self.placements[-1].node
                continue
            self.leftover.append(m)

    def _fallback(self, work: Work) -> None:
        if work.pool.require_island:
            self.missing.append((work, f"no island has {work.pool.tp} free GPUs joined by healthy NVLink/XGMI "
                                       "(pool requires an island)"))
            return
        free = {self.slots[k].members[p] for k in range(len(self.slots)) for p in self.slots[k].free}
        found = cross_island_group(self.request.topology, free, work.pool.tp,
                                   lambda refs: memory_fits(self.request.topology, work.pool, refs))
        if found is None:
            if cross_island_group(self.request.topology, free, work.pool.tp) is not None:
                reason = f"{work.pool.model} does not fit in GPU memory at tp={work.pool.tp} on any free GPUs"
            else:
                reason = f"no node has {work.pool.tp} free healthy GPUs without an unhealthy link"
            self.missing.append((work, reason))
            return
        refs, why = found
        slot_of = {m: k for k, s in enumerate(self.slots) for m in s.members}
        for r in refs:
            k = slot_of[r]
            self._take(k, frozenset({self.slots[k].members.index(r)}))
        self.placements.append(self.layout.placement(work, refs, [f"no island can hold tp={work.pool.tp}; {why}"]))

    def _fits(self, pool: PoolSpec, refs: list[GpuRef]) -> bool:
        return memory_fits(self.request.topology, pool, refs)

    def _gang_key(self, k: int, leftover: int, work: Work) -> tuple[object, ...]:
        slot = self.slots[k]
        return (-self._preference(work.strictness) * slot.quality, leftover, k)

    def _gang_sig(self, k: int, free: frozenset[int]) -> tuple[object, ...]:
        slot = self.slots[k]
        return (slot.shape, round(slot.quality, 3), free, gpu_memory_gb(self.request.topology, slot.members[0]))

    def _place_gangs(self, expert_parallel: bool | None = None) -> None:
        """Gangs (all, or only the EP or only the other ones): EP first, then largest."""
        gangs = sorted((w for w in replicas_in_order(self.request, sort=True) if w.pool.is_gang
                        and (expert_parallel is None or w.pool.expert_parallel == expert_parallel)),
                       key=lambda w: (not w.pool.expert_parallel, -w.pool.gang_size, -w.strictness))
        if not gangs:
            return
        chosen = DomainSearch(self.slots, self._fits, self._gang_key, self._gang_sig).assign(gangs)
        for work in gangs:
            choice = chosen.get(work.replica_id)
            if choice is None:
                continue
            groups = [self._take(choice.slot, g) for g in choice.groups]
            refs = [r for g in groups for r in g]
            text = self._reason(choice.slot, refs, f"{describe(work.pool)} in one NVLink domain")
            self.placements.append(self.layout.gang_placement(work, groups, text))
        for work in gangs:
            if work.replica_id not in chosen:
                self._span(work)

    def _span(self, work: Work) -> None:
        pool = work.pool
        if pool.require_domain:
            self.missing.append((work, f"no NVLink domain has room for the {describe(pool)} "
                                       "(pool requires one domain)"))
            return
        topology = self.request.topology
        sick = detached_gpus(topology, self.slots)
        found = span(topology, carriers(topology, self.slots, pool, sick), pool, self._fits) if sick else None
        found = found or span(topology, carriers(topology, self.slots, pool), pool, self._fits)
        if found is None:
            self.missing.append((work, f"not enough free GPUs for the {describe(pool)}: its TP groups of "
                                       f"{pool.tp} must each sit inside an island"
                                       + ("" if pool.require_island or pool.tp == 1 else " or on one node")))
            return
        groups, used = found
        slot_of = {m: (k, p) for k, s in enumerate(self.slots) for p, m in enumerate(s.members)}
        for r in (r for g in groups for r in g):
            k, p = slot_of[r]
            self._take(k, frozenset({p}))
        nodes = sorted({r.node for g in groups for r in g})
        racks = sorted({self.request.topology.node(n).rack or "-" for n in nodes})
        why = (f"{describe(pool)}: no free NVLink domain holds it; across {len(used)} carriers on "
               f"{len(nodes)} nodes ({', '.join(nodes[:4])}{'...' if len(nodes) > 4 else ''}) in rack(s) "
               f"{', '.join(racks)}, ranks contiguous per node")
        self.placements.append(self.layout.gang_placement(work, groups, [why]))

    def run(self) -> PlacementPlan:
        self._place_gangs(None if self.dense_gangs_first else True)
        for unit in _units(self.request, self.pd_units):
            self._place_unit(unit)
        if not self.dense_gangs_first:
            self._place_gangs(False)
        for work in self.leftover:
            self._fallback(work)
        in_island = sum(1 for p in self.placements if p.in_island)
        return finish(IslandAligned.name, self.request, self.placements, self.missing,
                      [f"{in_island} of {len(self.placements)} replicas inside one island"], self.layout)
