"""Properties of every placement policy on generated pools and real machines."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pools.model import PlacementRequest, PoolSpec
from pools.placement import POLICIES, place
from pools.placement.replan import replan
from pools.placement.validate import group_problems, validate_plan
from tests.pools.conftest import feasible_in_island
from topology import GpuRef, LinkHealth, Topology, is_clique, read_source
from topology.readers.spec import parse_spec

pytestmark = pytest.mark.unit

MACHINES: dict[str, Topology] = {
    name: read_source(name) for name in ("dgx1-v100", "a30-pairs", "h100-nvl-pairs", "rtx4090-pcie", "hgx-h100")
}
MACHINES["two-nodes-degraded"] = parse_spec(
    "nodes:\n  - {name: a, template: hgx-h100}\n  - name: b\n    template: dgx1-v100\n"
    "    degraded_links: [{gpus: [0, 3], lanes_active: 1, replay_per_min: 50}]\n")
MACHINES["local-sim"] = read_source("configs/clusters/local-sim.yaml")
MACHINES["a30+dgx1"] = parse_spec("nodes:\n  - {name: a, template: a30-pairs}\n  - {name: b, template: dgx1-v100}\n")
MACHINES["a30+nvl"] = parse_spec(
    "nodes:\n  - {name: a, template: a30-pairs}\n  - {name: b, template: h100-nvl-pairs}\n")

POLICY_NAMES = sorted(POLICIES)


@st.composite
def pool_sets(draw: st.DrawFn) -> tuple[PoolSpec, ...]:
    count = draw(st.integers(1, 4))
    out = []
    for k in range(count):
        out.append(PoolSpec(
            name=f"p{k}", role=draw(st.sampled_from(["prefill", "decode", "mixed"])),
            tp=draw(st.sampled_from([1, 2, 4, 8])), replicas=draw(st.integers(0, 4)),
            model=draw(st.sampled_from([None, "llama-3.1-8b"])),
            slo_classes=(draw(st.sampled_from(["interactive", "standard", "batch"])),),
            require_island=draw(st.booleans()),
        ))
    return tuple(out)


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(st.sampled_from(sorted(MACHINES)), pool_sets(), st.sampled_from(POLICY_NAMES), st.integers(0, 3))
def test_every_plan_validates_and_is_deterministic(machine: str, pools: tuple[PoolSpec, ...], policy: str,
                                                   seed: int) -> None:
    topology = MACHINES[machine]
    request = PlacementRequest(topology=topology, pools=pools, seed=seed)
    plan = place(request, policy)
    assert validate_plan(plan, topology) == []
    refs = [r for p in plan.placements for r in p.gpu_refs()]
    assert len(refs) == len(set(refs)), "a GPU used twice"
    assert place(request, policy).to_json() == plan.to_json(), "same seed, different plan"


@SETTINGS
@given(st.sampled_from(["dgx1-v100", "a30-pairs", "h100-nvl-pairs", "two-nodes-degraded", "hgx-h100", "a30+dgx1",
                        "a30+nvl"]),
       st.lists(st.tuples(st.sampled_from([1, 2, 4]), st.sampled_from(["prefill", "decode", "mixed"])),
                min_size=1, max_size=6))
def test_island_aligned_finds_an_in_island_assignment_whenever_one_exists(machine: str,
                                                                         groups: list[tuple[int, str]]) -> None:
    topology = MACHINES[machine]
    tps = [tp for tp, _ in groups]
    pools = tuple(PoolSpec(name=f"p{k}", role=role, tp=tp, replicas=1)  # type: ignore[arg-type]
                  for k, (tp, role) in enumerate(groups))
    plan = place(PlacementRequest(topology=topology, pools=pools), "island-aligned")
    if feasible_in_island(topology, sorted(tps, reverse=True)):
        assert plan.cross_island_tp_groups == 0 and not plan.unplaced, (tps, plan.to_json()["placements"])


def _changes(topology: Topology) -> list[tuple[str, Topology]]:
    out = []
    node = topology.nodes[-1]
    out.append(("node lost", replace(topology, nodes=topology.nodes[:-1])) if len(topology.nodes) > 1 else
               ("nothing", topology))
    bad_gpu = replace(node, gpus=tuple(replace(g, healthy=False, health_reasons=("XID 79",)) if g.index == 1 else g
                                       for g in node.gpus))
    out.append(("gpu lost", replace(topology, nodes=(*topology.nodes[:-1], bad_gpu))))
    added = parse_spec("nodes:\n  - {name: extra, template: hgx-h100}\n").nodes[0]
    out.append(("node added", replace(topology, nodes=(*topology.nodes, added))))
    dead = LinkHealth(score=0.0, healthy=False, bandwidth_factor=0.0, reasons=("all NVLink lanes inactive",))
    first = next((k for k in node.links if k.kind.is_gpu_fabric), None)
    links = tuple(replace(k, health=dead) if k is first else k for k in node.links)
    out.append(("link down", replace(topology, nodes=(*topology.nodes[:-1], replace(node, links=links)))))
    return out


@SETTINGS
@given(st.sampled_from(sorted(MACHINES)), pool_sets(), st.sampled_from(POLICY_NAMES), st.integers(0, 3))
def test_replan_moves_only_what_must_move(machine: str, pools: tuple[PoolSpec, ...], policy: str,
                                          change: int) -> None:
    topology = MACHINES[machine]
    old = place(PlacementRequest(topology=topology, pools=pools), policy)
    _, new_topology = _changes(topology)[change]
    result = replan(old, new_topology, previous=topology)
    assert validate_plan(result.plan, new_topology) == []
    moved = {m.replica_id for m in result.moves}
    new_by_id = {p.replica_id: p for p in result.plan.placements}
    island_aware = POLICIES[policy].island_aware
    for p in old.placements:
        refs = [GpuRef(n, g) for n, g in p.gpu_refs()]
        must_move = bool(group_problems(new_topology, old.pool(p.pool), refs, island_aware)) or (
            island_aware and p.in_island and len(refs) > 1 and not is_clique(new_topology, refs))
        assert (p.replica_id in moved) == must_move, (p.replica_id, must_move)
        if not must_move:
            kept = new_by_id[p.replica_id]
            assert (kept.node, kept.gpus, kept.extra_nodes) == (p.node, p.gpus, p.extra_nodes)
    assert result.plan.slo_classes == old.slo_classes
