"""Expert placement policies: `linear`, `eplb` and `topology`, each `(shares, gang, physical,
groups) -> LayerMap` for one layer (`shares`: each logical expert's share of the pairs;
`physical`: slots in all, a multiple of the gang's size; `groups`: the model's expert groups).

- `linear`: vLLM's default (`--expert-placement-strategy linear`): physical slot j holds expert
  j mod E, GPU i the slots i*s .. i*s+s-1; redundant slots repeat the first experts.
- `eplb`: DeepSeek's EPLB as its published description states it (deepseek-ai/EPLB README, as
  vLLM ports it): when the expert groups divide among the nodes (hosts), hierarchical: pack
  groups onto nodes balancing their load, replicate the hottest experts inside each node (each
  redundant slot to the expert with the most load per replica), pack the replicas onto the
  node's GPUs balancing load; otherwise the same with one node (global). Its "node" is a host.
- `topology`: NVLink domains instead of hosts as the hierarchy: every expert once, heaviest
  first, to the domain with the least load per GPU; redundant slots first where a domain lacks
  a hot expert (a replica there keeps that domain's pairs for it local), the rest to relieve the
  busiest replica; replicas packed onto each domain's GPUs by the load routing gives them. Of
  the maps that spend more or fewer slots on coverage, and EPLB's own, the one whose step the
  cost model predicts shortest (`pools.experts.objective`), EPLB's when it is at least as fast:
  so its predicted step is never longer than EPLB's. Without a step to minimise, the one with
  the most coverage whose balancedness is within `BALANCE_SLACK` of the better of EPLB's map and
  a pure balancer's (EPLB's global policy) on the same load, as this routing serves them.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

from pools.experts.metrics import Gang, LayerMap, LayerStats, route

Policy = Callable[[Sequence[float], Gang, int, int], LayerMap]


def _slots_per_gpu(physical: int, gang: Gang, experts: int) -> int:
    if physical < experts or physical % gang.size:
        raise ValueError(f"{physical} physical experts for {experts} logical on {gang.size} GPUs: need at least "
                         f"one slot per expert and the same number on every GPU (redundant experts R with "
                         f"(E + R) % EP == 0)")
    return physical // gang.size


def linear(shares: Sequence[float], gang: Gang, physical: int, groups: int = 1) -> LayerMap:
    experts = len(shares)
    per = _slots_per_gpu(physical, gang, experts)
    return tuple(tuple(j % experts for j in range(i * per, (i + 1) * per)) for i in range(gang.size))


def balanced_packing(weights: Sequence[float], packs: int) -> list[list[int]]:
    """Items (heaviest first) into `packs` packs of equal count, each to the lightest pack with
    room (EPLB's balanced_packing)."""
    if len(weights) % packs:
        raise ValueError(f"{len(weights)} items do not split into {packs} equal packs")
    per = len(weights) // packs
    out: list[list[int]] = [[] for _ in range(packs)]
    lightest = [(0.0, k) for k in range(packs)]  # (load, pack) of every pack with room: a heap
    for i in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        load, k = heapq.heappop(lightest)
        out[k].append(i)
        if len(out[k]) < per:
            heapq.heappush(lightest, (load + weights[i], k))
    return out


def replicate(weights: Sequence[float], slots: int) -> list[int]:
    """Physical experts as indices into `weights`: each once, then every extra slot to the one
    with the most load per replica, in the order chosen (EPLB's replicate_experts)."""
    count = [1] * len(weights)
    phys = list(range(len(weights)))
    for _ in range(slots - len(weights)):
        i = max(range(len(weights)), key=lambda i: (weights[i] / count[i], -i))
        count[i] += 1
        phys.append(i)
    return phys


def _pack_units(shares: Sequence[float], units: list[list[int]], unit_gpus: list[list[int]], per: int,
                groups: int, gang: Gang) -> LayerMap:
    """EPLB's hierarchy over `units` (hosts or domains; `unit_gpus`: their GPUs): groups onto
    units, replication inside each unit, replicas onto the unit's GPUs."""
    experts = len(shares)
    size = experts // groups
    group_load = [sum(shares[g * size:(g + 1) * size]) for g in range(groups)]
    placed = balanced_packing(group_load, len(units))
    held: list[list[int]] = [[] for _ in range(gang.size)]
    for unit, group_ids in enumerate(placed):
        logical = [e for g in group_ids for e in range(g * size, (g + 1) * size)]
        gpus = unit_gpus[unit]
        chosen = replicate([shares[e] for e in logical], len(gpus) * per)
        count = [chosen.count(i) for i in range(len(logical))]
        phys = [logical[i] for i in chosen]
        phys_load = [shares[logical[i]] / count[i] for i in chosen]
        for k, pack in enumerate(balanced_packing(phys_load, len(gpus))):
            held[gpus[k]] = sorted(phys[i] for i in pack)
    return tuple(tuple(h) for h in held)


def _by(keys: Sequence[str]) -> list[list[int]]:
    order: dict[str, list[int]] = {}
    for i, k in enumerate(keys):
        order.setdefault(k, []).append(i)
    return list(order.values())


def eplb(shares: Sequence[float], gang: Gang, physical: int, groups: int = 1) -> LayerMap:
    per = _slots_per_gpu(physical, gang, len(shares))
    hosts = _by(gang.host)
    even = len({len(h) for h in hosts}) == 1
    if groups > 1 and even and groups % len(hosts) == 0 and len(shares) % groups == 0:
        return _pack_units(shares, [[k] for k in range(len(hosts))], hosts, per, groups, gang)
    return _pack_units(shares, [[0]], [list(range(gang.size))], per, 1, gang)


COVERAGE_STEPS = (1.0, 0.75, 0.5, 0.25, 0.0)
"""Shares of the redundant slots `topology` tries spending on domains that lack an expert (the
rest relieve the busiest replicas), most first."""
BALANCE_SLACK = 0.01
"""How much balancedness `topology` gives up, at most, against a pure balancer on the same load."""


def topology(shares: Sequence[float], gang: Gang, physical: int, groups: int = 1, *,
             step: Callable[[LayerStats], float] | None = None, locality: bool = True,
             rival: LayerMap | None = None) -> LayerMap:
    """With `step` (the gang's predicted step for a map's figures, `pools.experts.objective`):
    the map with the shortest step among those that spend more or fewer redundant slots on
    coverage, and EPLB's own map, which it returns when that is at least as fast. Without: the
    map with the fewest pairs crossing domains among those about as balanced as EPLB makes this
    load (module docstring). `locality`: tokens keep to their domain's replicas (`metrics.route`).
    `rival`: EPLB's map as the engine computed it (vLLM's own policy), else `eplb`'s."""
    per = _slots_per_gpu(physical, gang, len(shares))
    rival = rival if rival is not None else eplb(shares, gang, physical, groups)
    maps = [_topology_map(shares, gang, physical, round(c * (physical - len(shares))), locality)
            for c in COVERAGE_STEPS]
    if step is not None:
        best = min(maps, key=lambda m: step(route(shares, m, gang, locality)))
        return rival if step(route(shares, rival, gang, locality)) <= step(route(shares, best, gang, locality)) \
            else best
    target = max(route(shares, _pack_units(shares, [[0]], [list(range(gang.size))], per, 1, gang), gang,
                       locality).balancedness, route(shares, rival, gang, locality).balancedness)
    balance = [route(shares, m, gang, locality).balancedness for m in maps]
    fits = [m for m, b in zip(maps, balance, strict=True) if b >= target - BALANCE_SLACK]
    return fits[0] if fits else maps[max(range(len(maps)), key=lambda k: (balance[k], -k))]


def _topology_map(shares: Sequence[float], gang: Gang, physical: int, coverage: int, locality: bool = True
                  ) -> LayerMap:
    experts = len(shares)
    per = _slots_per_gpu(physical, gang, experts)
    domains = _by(gang.domain)
    names = [gang.domain[d[0]] for d in domains]
    weight = [gang.weights()[n] for n in names]
    slots = [len(d) * per for d in domains]
    used = [0] * len(domains)
    count: list[dict[int, int]] = [dict() for _ in domains]

    def add(k: int, e: int) -> None:
        count[k][e] = count[k].get(e, 0) + 1
        used[k] += 1

    # one replica of every expert, heaviest first, to the domain with the least load per GPU
    load = [0.0] * len(domains)
    for e in sorted(range(experts), key=lambda e: (-shares[e], e)):
        k = min((k for k in range(len(domains)) if used[k] < slots[k]), key=lambda k: (load[k] / len(domains[k]), k))
        add(k, e)
        load[k] += shares[e]
    # coverage: a replica where a domain lacks a hot expert keeps that domain's pairs local (the
    # best pair first; a pair that stops qualifying never qualifies again, so one pass suffices)
    if coverage > 0:
        pairs = sorted(((shares[e] * weight[k], k, e) for k in range(len(domains)) for e in range(experts)),
                       reverse=True)
        placed = 0
        for _, k, e in pairs:
            if placed == coverage:
                break
            if used[k] < slots[k] and not count[k].get(e):
                add(k, e)
                placed += 1

    def top(e: int) -> float:
        """The load on expert e's busiest replica, as routing sends it."""
        total = sum(c.get(e, 0) for c in count)
        miss = sum(weight[k] for k in range(len(domains)) if not count[k].get(e))
        return max(shares[e] * (weight[k] / count[k][e] + miss / total) if locality else shares[e] / total
                   for k in range(len(domains)) if count[k].get(e))

    # balance: every other slot relieves the busiest replica, in a domain that lacks its expert
    # when one has room (which also keeps that domain's pairs local), else beside it
    tops = [top(e) for e in range(experts)]
    for _ in range(physical - sum(used)):
        open_ = [k for k in range(len(domains)) if used[k] < slots[k]]
        if not open_:
            break
        e = max(range(experts), key=lambda e: (tops[e], -e))
        lacking = [k for k in open_ if not count[k].get(e)]
        k = max(lacking or open_, key=lambda k: (weight[k] / max(count[k].get(e, 0), 1), -k))
        add(k, e)
        tops[e] = top(e)
    return _pack_domains(shares, gang, domains, count, per, locality)


def _pack_domains(shares: Sequence[float], gang: Gang, domains: list[list[int]], count: list[dict[int, int]],
                  per: int, locality: bool) -> LayerMap:
    """Each domain's replicas onto its GPUs, balanced by the load routing sends each replica:
    its domain's tokens for the expert split over the replicas there, plus its share of the
    tokens from domains without one (`metrics.route`); without `locality`, the expert's tokens
    split over all its replicas."""
    weight = gang.weights()
    names = [gang.domain[d[0]] for d in domains]
    total = [sum(count[k].get(e, 0) for k in range(len(domains))) for e in range(len(shares))]
    miss = [sum(weight[names[k]] for k in range(len(domains)) if not count[k].get(e)) for e in range(len(shares))]
    held: list[list[int]] = [[] for _ in range(gang.size)]
    for k, gpus in enumerate(domains):
        reps = [e for e, c in sorted(count[k].items()) for _ in range(c)]
        loads = [shares[e] * (weight[names[k]] / count[k][e] + miss[e] / total[e]) if locality
                 else shares[e] / total[e] for e in reps]
        for j, pack in enumerate(balanced_packing(loads, len(gpus))):
            held[gpus[j]] = sorted(reps[i] for i in pack)
        if any(len(held[g]) != per for g in gpus):
            raise ValueError("internal: a domain's replicas do not fill its GPUs")
    return tuple(tuple(h) for h in held)


POLICIES: dict[str, Policy] = {"linear": linear, "eplb": eplb, "topology": topology}
