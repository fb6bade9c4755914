"""Gangs (tp x pp x dp replicas) on small clusters, checked against exact enumerations: EP gangs
inside NVLink domains whenever an assignment holds them, TP groups inside cliques, pipeline
boundaries on the cheapest cuts, spanning gangs on the fewest nodes of one rack, baselines
placing the same gangs, and the plan JSON."""

from __future__ import annotations

import random
from functools import cache
from itertools import combinations, pairwise, permutations

import pytest

from pools.model import PlacementPlan, PlacementRequest, PoolSpec
from pools.placement import POLICIES, place
from pools.placement.layout import memory_fits
from pools.placement.validate import tp_groups, validate_plan
from topology import GpuRef, Topology, is_clique, islands, tier
from topology.paths import TIERS
from topology.readers.spec import parse_spec

pytestmark = pytest.mark.unit

MOE = "qwen3-30b-a3b"  # fits any tp/ep on H100 and GB200; needs ep >= 4 on 24-32 GB GPUs
NETWORK = {"rdma", "tcp", "rack"}
POLICY_NAMES = sorted(POLICIES)


@cache
def cluster(nvl: tuple[int, ...] = (), hgx: int = 0, extra: tuple[str, ...] = (), hgx_rack: str = "hx") -> Topology:
    """NVL72 racks of `nvl[i]` trays (one NVLink domain each), `hgx` HGX H100 nodes in one rack,
    and one node per `extra` template outside any rack."""
    text = "racks:\n"
    for i, trays in enumerate(nvl):
        text += f"  - name: nvl{i}\n    nodes: [{{name: t{i}, template: gb200-nvl72, count: {trays}}}]\n"
    if hgx:
        text += f"  - name: {hgx_rack}\n    nodes: [{{name: h, template: hgx-h100, count: {hgx}}}]\n"
    if not nvl and not hgx:
        text = ""
    if extra:
        text += "nodes:\n" + "".join(f"  - {{name: x{k}, template: {t}}}\n" for k, t in enumerate(extra))
    return parse_spec(text)


def gang(name: str, tp: int, dp: int = 1, pp: int = 1, replicas: int = 1, ep: bool = False, **kw: object) -> PoolSpec:
    return PoolSpec(name=name, role="mixed", tp=tp, dp=dp, pp=pp, replicas=replicas, expert_parallel=ep,
                    model=MOE if ep else None, **kw)  # type: ignore[arg-type]


def run(topology: Topology, pools: list[PoolSpec], policy: str = "island-aligned") -> PlacementPlan:
    plan = place(PlacementRequest(topology=topology, pools=tuple(pools)), policy)
    assert validate_plan(plan, topology) == [], (policy, validate_plan(plan, topology))
    for p in pools:
        got = sum(1 for pl in plan.placements if pl.pool == p.name) + sum(u.count for u in plan.unplaced
                                                                           if u.pool == p.name)
        assert got == p.replicas, (policy, p.name)
    for pl in plan.placements:
        if plan.pool(pl.pool).is_gang:
            assert pl.members and (pl.node, pl.gpus) == (pl.members[0].node, pl.members[0].gpus)
    return plan


# --- exact oracle: items (pool, TP sizes) into islands, each item inside one island, every TP
# group a clique of healthy GPUs the model fits on ---------------------------------------------

def feasible(topology: Topology, items: list[tuple[PoolSpec, tuple[int, ...]]]) -> bool:
    isls = [tuple(g for g in isl.gpus if topology.gpu(g).healthy) for isl in islands(topology)]
    isls = [g for g in isls if g]
    full = [is_clique(topology, list(g)) for g in isls]
    items = sorted(items, key=lambda it: -sum(it[1]))
    memo: dict[tuple[int, tuple[frozenset[GpuRef], ...]], bool] = {}

    def carvings(k: int, free: frozenset[GpuRef], sizes: tuple[int, ...]) -> list[frozenset[GpuRef]]:
        if not sizes:
            return [frozenset()]
        if full[k]:  # any GPUs of a fully connected island will do
            need = sum(sizes)
            return [frozenset(sorted(free)[:need])] if len(free) >= need else []
        out: list[frozenset[GpuRef]] = []
        for g in combinations(sorted(free), sizes[0]):
            if is_clique(topology, list(g)):
                out.extend(frozenset(g) | rest for rest in carvings(k, free - set(g), sizes[1:]))
        return out

    def go(i: int, state: tuple[frozenset[GpuRef], ...]) -> bool:
        if i == len(items):
            return True
        key = (i, state)
        if key not in memo:
            pool, sizes = items[i]
            memo[key] = False
            seen = set()
            for k, free in enumerate(state):
                sig = (len(free), len(isls[k]), topology.gpu(isls[k][0]).model) if full[k] else k
                if len(free) < sum(sizes) or sig in seen or not memory_fits(topology, pool, isls[k][:1]):
                    continue
                seen.add(sig)
                if any(go(i + 1, (*state[:k], free - c, *state[k + 1:])) for c in carvings(k, free, sizes)):
                    memo[key] = True
                    break
        return memo[key]

    return go(0, tuple(frozenset(g) for g in isls))


def gang_items(pools: list[PoolSpec], only_ep: bool = False) -> list[tuple[PoolSpec, tuple[int, ...]]]:
    return [(p, (p.tp,) * (p.dp * p.pp)) for p in pools if p.is_gang and (p.expert_parallel or not only_ep)
            for _ in range(p.replicas)]


def group_items(pools: list[PoolSpec]) -> list[tuple[PoolSpec, tuple[int, ...]]]:
    return [(p, (p.tp,)) for p in pools for _ in range(p.replicas * p.dp * p.pp)]


CLUSTERS = [
    cluster((4,), 1), cluster((2,), 2), cluster((3, 1), 1), cluster((4,), 0, ("dgx1-v100",)), cluster((), 2),
    cluster((2,), 1, ("a30-pairs",)), cluster((1,), 1, ("h100-nvl-pairs",)), cluster((), 1, ("rtx4090-pcie",)),
    cluster((), 0, ("dgx1-v100", "a30-pairs")), cluster((2, 2), 0), cluster((6,), 2),
]


def random_pools(rng: random.Random) -> list[PoolSpec]:
    pools = []
    for k in range(rng.randint(1, 3)):
        tp, dp, pp = rng.choice([1, 2, 4]), rng.choice([1, 2, 3, 4]), rng.choice([1, 1, 2, 3])
        if dp * pp == 1:
            dp = 2
        pools.append(gang(f"g{k}", tp, dp, pp, replicas=rng.randint(1, 2), ep=rng.random() < 0.5,
                          slo_classes=(rng.choice(["interactive", "standard", "batch"]),)))
    for k in range(rng.randint(0, 3)):
        pools.append(PoolSpec(name=f"r{k}", role=rng.choice(["prefill", "decode", "mixed"]),
                              tp=rng.choice([1, 1, 2, 4, 8]), replicas=rng.randint(1, 3),
                              slo_classes=(rng.choice(["interactive", "batch"]),)))
    return pools


def test_random_gangs_in_domain_whenever_an_assignment_exists() -> None:
    """Criteria 1, 2 and 5 on 200 seeded cases: every policy's plan validates; island-aligned puts
    every EP gang inside one domain (and counts no cross-domain EP gang) whenever some assignment
    holds all of them (dense gangs only need cliques: a plan may trade one for more placed GPUs),
    and every TP group inside a clique whenever some assignment does."""
    rng = random.Random(20240607)
    checked = {"domain": 0, "clique": 0}
    for case in range(200):
        topology = rng.choice(CLUSTERS)
        pools = random_pools(rng)
        plan = {policy: run(topology, pools, policy) for policy in POLICY_NAMES}["island-aligned"]
        if feasible(topology, gang_items(pools, only_ep=True)):
            checked["domain"] += 1
            spanning = [p.replica_id for p in plan.placements if p.expert_parallel and not p.in_domain]
            gang_unplaced = [u for u in plan.unplaced if plan.pool(u.pool).expert_parallel]
            assert not spanning and not gang_unplaced and plan.cross_domain_ep_groups == 0, (case, pools)
        if feasible(topology, group_items(pools)):
            checked["clique"] += 1
            assert not [u for u in plan.unplaced if plan.pool(u.pool).is_gang], (case, pools, plan.unplaced)
            assert all(is_clique(topology, g) or len(g) == 1 for p in plan.placements if p.members
                       for g in tp_groups(p)), (case, pools)
    assert checked["domain"] > 40 and checked["clique"] > 20, checked


def test_strict_tp1_replica_does_not_take_the_only_domain_large_enough() -> None:
    topology = cluster((4,), 1)
    slo = {"strict": ("interactive",), "lax": ("batch",)}
    pools = [PoolSpec(name="fast", role="decode", tp=1, replicas=1, slo_classes=slo["strict"]),
             gang("ep", 2, dp=8, ep=True, slo_classes=slo["lax"])]
    for request_pools in (pools, pools[::-1]):
        plan = run(topology, request_pools)
        ep = next(p for p in plan.placements if p.pool == "ep")
        assert ep.in_domain and ep.island.startswith("nvl:") and plan.cross_domain_ep_groups == 0
        assert not plan.unplaced


def test_ep_gang_keeps_its_domain_against_non_ep_gangs() -> None:
    """Two dense DP gangs could fill the NVL domain; the EP gang, which needs it for its
    all-to-all, gets it instead (the dense ones fit on the HGX node and the NVL pairs)."""
    topology = parse_spec("racks:\n  - name: nvl0\n    nodes: [{name: t, template: gb200-nvl72, count: 4}]\n"
                          "  - name: hx\n    nodes: [{name: h, template: hgx-h100}, "
                          "{name: n, template: h100-nvl-pairs, count: 2}]\n")
    pools = [gang("ep", 2, dp=8, ep=True), gang("g", 2, dp=4, replicas=3)]
    assert feasible(topology, gang_items(pools, only_ep=True))
    plan = run(topology, pools)
    assert not plan.unplaced
    ep = next(p for p in plan.placements if p.pool == "ep")
    assert ep.in_domain, (ep.island, ep.tier)


def test_gang_does_not_push_an_ordinary_tp_group_out_of_its_island() -> None:
    """A dense gang's TP groups only need cliques: it goes to the bridge pairs and every tp=4
    replica keeps a 4-GPU clique."""
    topology = cluster((1,), 1, ("h100-nvl-pairs",))
    pools = [gang("g", 2, dp=2), PoolSpec(name="r", role="mixed", tp=4, replicas=3)]
    assert feasible(topology, group_items(pools))
    plan = run(topology, pools)
    assert not plan.unplaced and plan.cross_island_tp_groups == 0, [(p.replica_id, p.island) for p in plan.placements]


def test_ep_gangs_fill_domains_exactly_and_count_the_rest() -> None:
    # Two 8-GPU EP gangs, one 16-GPU EP gang: NVL rack of 16 and two HGX nodes hold all three
    # only if the 16 goes to the rack; a greedy best-fit would put an 8 into the rack.
    topology = cluster((4,), 2)
    pools = [gang("small", 4, dp=2, replicas=2, ep=True), gang("big", 4, dp=4, ep=True)]
    plan = run(topology, pools)
    assert all(p.in_domain for p in plan.placements) and plan.cross_domain_ep_groups == 0
    assert next(p for p in plan.placements if p.pool == "big").island.startswith("nvl:")
    # One more 8-GPU EP gang than the cluster holds in domains: it is unplaced, not an exception.
    more = run(topology, [gang("small", 4, dp=2, replicas=3, ep=True), gang("big", 4, dp=4, ep=True)])
    assert sum(u.count for u in more.unplaced) + len(more.placements) == 4


def _min_network_cuts(topology: Topology, stages: list[list[GpuRef]]) -> int:
    """Fewest network boundaries over every order of the same stage groups (stage 0 fixed first
    is not required: any order)."""
    best = len(stages)
    for order in permutations(stages):
        cuts = sum(1 for a, b in pairwise(order)
                   if any(tier(topology, [x, y]) in NETWORK for x, y in zip(a, b, strict=False)))
        best = min(best, cuts)
    return best


@pytest.mark.parametrize(("topology", "pool", "nodes"), [
    (cluster((), 3), gang("pp", 4, pp=4), 2),
    (cluster((), 3), gang("pp", 2, dp=2, pp=4), 2),
    (cluster((), 3), gang("pp", 8, pp=3), 3),
    (cluster((), 4), gang("pp", 2, pp=5, dp=2), 3),
    (cluster((2,), 2), gang("pp", 4, pp=5), 3),
    (cluster((), 2, ("dgx1-v100",)), gang("pp", 4, pp=4, dp=1), 2),
])
def test_pp_boundaries_sit_on_the_cheapest_cuts(topology: Topology, pool: PoolSpec, nodes: int) -> None:
    plan = run(topology, [pool])
    (pl,) = plan.placements
    stages: dict[int, list[GpuRef]] = {}
    for m in pl.members:
        stages.setdefault(m.pp_stage, []).extend(GpuRef(m.node, g) for g in m.gpus)
    groups = [stages[s] for s in sorted(stages)]
    assert sorted(stages) == list(range(pool.pp)) and all(len(g) == pool.tp * pool.dp for g in groups)
    for g in tp_groups(pl):  # no stage boundary inside a TP group: each group one stage, one clique
        assert len({m.pp_stage for m in pl.members if GpuRef(m.node, m.gpus[0]) in g}) == 1
        assert is_clique(topology, g) or len(g) == 1
    cuts = [max((tier(topology, [a, b]) for a, b in zip(x, y, strict=False)), key=TIERS.index)
            for x, y in pairwise(groups)]
    network = sum(1 for t in cuts if t in NETWORK)
    used = {r.node for g in groups for r in g}
    assert sum(plan.pp_boundaries.values()) == pool.pp - 1
    assert sum(plan.pp_boundaries.get(t, 0) for t in NETWORK) == network
    assert network == _min_network_cuts(topology, groups)
    if not pl.in_domain:
        units = {pl_isl for pl_isl in pl.island.split("+")}
        assert network == len(units) - 1 and len(used) == nodes, (cuts, sorted(used))


def _check_spanning(topology: Topology, plan: PlacementPlan) -> None:
    for pl in plan.placements:
        for stage in {m.pp_stage for m in pl.members}:
            ms = [m for m in pl.members if m.pp_stage == stage]
            assert [m.dp_rank_start for m in ms] == sorted(m.dp_rank_start for m in ms)
            runs = [n for k, n in enumerate(m.node for m in ms) if k == 0 or ms[k - 1].node != n]
            assert len(runs) == len(set(runs)), f"{pl.replica_id}: ranks of a node not contiguous {runs}"
        for m in pl.members:
            nics = topology.node(m.node).nics
            if not nics:
                assert m.nic is None
                continue
            best = max(int(n.level_to(m.gpus[0]) or 0) for n in nics)
            mine = next(n for n in nics if n.name == m.nic)
            assert int(mine.level_to(m.gpus[0]) or 0) == best, (pl.replica_id, m)


def test_spanning_gang_uses_the_fewest_nodes_of_one_rack_and_the_rails() -> None:
    topology = parse_spec("racks:\n  - {name: a, nodes: [{name: a, template: hgx-h100}]}\n"
                          "  - {name: b, nodes: [{name: b, template: hgx-h100, count: 3}]}\n")
    for pool in (gang("ep", 4, dp=4, ep=True), gang("dp", 2, dp=6), gang("pp", 4, pp=2, dp=2)):
        plan = run(topology, [pool])
        (pl,) = plan.placements
        nodes = {m.node for m in pl.members}
        assert len(nodes) == 2 and {topology.node(n).rack for n in nodes} == {"b"}, nodes
        assert pl.tier == "rdma" and not pl.in_domain
        _check_spanning(topology, plan)
    # rail-aligned: the NIC of each rank is the one under its first GPU
    plan = run(topology, [gang("dp", 1, dp=16)])
    assert [m.nic for m in plan.placements[0].members[:8]] == [f"mlx5_ib{i}" for i in range(8)]
    _check_spanning(topology, plan)


def test_spanning_across_islands_and_nodes_keeps_ranks_contiguous() -> None:
    for topology, pools in [
        (cluster((1,), 1, ("h100-nvl-pairs",)), [gang("a", 2, dp=3, replicas=2), gang("b", 1, dp=4, pp=2)]),
        (cluster((), 0, ("a30-pairs", "a30-pairs", "dgx1-v100")), [gang("c", 2, dp=4), gang("d", 4, dp=1, pp=2)]),
        (cluster((2, 1), 0), [gang("e", 2, dp=5, ep=True), gang("f", 1, dp=2)]),
    ]:
        plan = run(topology, pools)
        assert not plan.unplaced
        _check_spanning(topology, plan)
        assert plan.cross_island_tp_groups == 0


def test_require_domain_and_infeasible_gangs_are_unplaced_with_reasons() -> None:
    topology = cluster((2,), 2)
    pools = [gang("rd", 4, dp=3, require_domain=True), gang("ok", 4, dp=2, require_domain=True),
             gang("huge", 8, dp=8), gang("island", 8, dp=2, require_island=True)]
    for policy in POLICY_NAMES:
        plan = run(topology, pools, policy)
        reasons = {u.pool: u.reason for u in plan.unplaced}
        assert "huge" in reasons and "rd" in reasons, (policy, reasons)
        if policy == "island-aligned":
            assert "NVLink domain" in reasons["rd"], reasons["rd"]
            ok = next(p for p in plan.placements if p.pool == "ok")
            assert ok.in_domain
            isl = next(p for p in plan.placements if p.pool == "island")
            assert isl.in_island and not isl.in_domain
    # a gang on a cluster with no GPUs of the right kind: no exception from any policy
    for policy in POLICY_NAMES:
        plan = run(cluster((), 0, ("rtx4090-pcie",)), [gang("tp2", 2, dp=2, require_island=True),
                                                       gang("mem", 1, dp=2, ep=True)], policy)
        assert {u.pool for u in plan.unplaced} >= {"tp2"}


def test_baselines_put_ep_gangs_across_domains_where_island_aligned_does_not() -> None:
    """The README comparison: a TP=1 decode declared first, then a 16-GPU EP gang, on one NVL72
    rack of 4 trays and two HGX H100 nodes."""
    topology = cluster((4,), 2)
    pools = [PoolSpec(name="decode", role="decode", tp=1, replicas=1, slo_classes=("interactive",)),
             gang("ep", 4, dp=4, ep=True, slo_classes=("batch",))]
    plans = {p: run(topology, pools, p) for p in POLICY_NAMES}
    ours = next(p for p in plans["island-aligned"].placements if p.pool == "ep")
    assert ours.in_domain and ours.tier == "nvlink" and plans["island-aligned"].cross_domain_ep_groups == 0
    for name in ("ray-pack", "first-fit"):
        theirs = next(p for p in plans[name].placements if p.pool == "ep")
        assert not theirs.in_domain and TIERS.index(theirs.tier) > TIERS.index("nvlink"), (name, theirs.tier)
        assert plans[name].cross_domain_ep_groups == 1
    for plan in plans.values():
        assert len(plan.placements) + sum(u.count for u in plan.unplaced) == 2


def test_plan_json_of_gangs() -> None:
    topology = cluster((1,), 2)
    pools = [gang("ep", 2, dp=4, pp=2, ep=True), PoolSpec(name="tp", role="mixed", tp=2, replicas=1)]
    for policy in POLICY_NAMES:
        doc = run(topology, pools, policy).to_json()
        summary = doc["summary"]
        assert type(summary["cross_domain_ep_groups"]) is int
        assert isinstance(summary["pp_boundaries"], dict)
        assert all(t in TIERS and type(n) is int for t, n in summary["pp_boundaries"].items())
        assert sum(summary["pp_boundaries"].values()) == 1
        g = next(p for p in doc["placements"] if p["pool"] == "ep")
        members = g["members"]
        assert all(set(m) == {"node", "gpus", "dp_rank_start", "pp_stage", "nic"} for m in members)
        assert (g["node"], g["gpus"]) == (members[0]["node"], members[0]["gpus"])
        order = [(m["pp_stage"], m["dp_rank_start"]) for m in members]
        assert order == sorted(order) and {s for s, _ in order} == {0, 1}
        assert sum(len(m["gpus"]) for m in members) == 16
        t = next(p for p in doc["placements"] if p["pool"] == "tp")
        assert "members" not in t
