"""Named real machines: island-aligned keeps every TP group inside an island whenever an
in-island assignment exists; Ray's default PACK crosses islands where index order does."""

from __future__ import annotations

from pathlib import Path

import pytest

from pools.model import PlacementPlan, PlacementRequest, PoolSpec
from pools.placement import POLICIES, place
from pools.placement.validate import validate_plan
from tests.conftest import shared_path
from tests.pools.conftest import feasible_in_island
from topology import Topology, read_source
from topology.readers.spec import parse_spec

pytestmark = pytest.mark.unit


def pools(*tps: int, role: str = "mixed", model: str | None = None) -> tuple[PoolSpec, ...]:
    return tuple(PoolSpec(name=f"tp{tp}-{k}", role=role, tp=tp, replicas=1, model=model)  # type: ignore[arg-type]
                 for k, tp in enumerate(tps))


def capture(stem: str) -> Topology:
    return read_source(str(shared_path("topo", f"{stem}.txt")))


def groups(plan: PlacementPlan) -> dict[str, tuple[int, ...]]:
    return {p.pool: p.gpus for p in plan.placements}


def run(topology: Topology, pool_specs: tuple[PoolSpec, ...], policy: str) -> PlacementPlan:
    plan = place(PlacementRequest(topology=topology, pools=pool_specs), policy)
    assert validate_plan(plan, topology) == []
    return plan


MACHINES = [
    # (name, topology factory, TP sizes in declared order, what ray-pack does, crossing groups)
    ("hgx-h100 (NVSwitch): index order never crosses", lambda: capture("hgx-h100-8gpu-nv18-13nic"), (1, 2, 4), {}),
    ("dgx1-v100 (hybrid cube mesh): ray-pack puts tp4 on 3,4,5,6", lambda: capture(
        "dgx1-v100-8gpu-hybrid-cube-mesh-1nic"), (1, 2, 4), {"tp4-2": (3, 4, 5, 6)}),
    ("a30 pairs: ray-pack puts tp2 on 1,2 across the sockets", lambda: capture(
        "a30-4gpu-nv4-bridge-pairs-1nic"), (1, 2), {"tp2-1": (1, 2)}),
    ("h100-nvl pairs: ray-pack splits every bridge pair", lambda: read_source("h100-nvl-pairs"),
     (1, 2, 2, 2), {"tp2-1": (1, 2), "tp2-2": (3, 4), "tp2-3": (5, 6)}),
    ("gb200 nvl72 rack: one NVLink domain, nothing to cross",
     lambda: read_source("configs/clusters/gb200-nvl72.yaml"), (4,) * 10 + (8,) * 4, {}),
    ("two hgx-h100, GPU1-GPU2 NVLink degraded: ray-pack uses the bad link", lambda: parse_spec(
        "nodes:\n  - {name: a, template: hgx-h100}\n  - name: b\n    template: hgx-h100\n"
        "    degraded_links: [{gpus: [1, 2], lanes_active: 4, replay_per_min: 30}]\n"),
     (8, 4, 4), {"tp4-1": (0, 1, 2, 3)}),
]


@pytest.mark.parametrize(("name", "factory", "tps", "ray_crossings"), MACHINES,
                         ids=[m[0].split(" ")[0] for m in MACHINES])
def test_island_aligned_vs_ray_pack(name: str, factory: object, tps: tuple[int, ...],
                                    ray_crossings: dict[str, tuple[int, ...]]) -> None:
    topology = factory()  # type: ignore[operator]
    spec = pools(*tps)
    ours = run(topology, spec, "island-aligned")
    ray = run(topology, spec, "ray-pack")
    if len(topology.gpu_refs()) <= 16:
        assert feasible_in_island(topology, sorted(tps, reverse=True)), name
    assert ours.cross_island_tp_groups == 0 and not ours.unplaced, name
    assert all(p.in_island for p in ours.placements)
    crossing = {p.pool: p.gpus for p in ray.placements if not p.in_island}
    assert crossing == ray_crossings, name
    print(f"{name}: island-aligned {groups(ours)}; ray-pack crosses {crossing or 'nothing'}")


def test_rtx4090_has_no_island_so_tp_stays_on_one_socket() -> None:
    topology = capture("rtx4090-8gpu-pcie-2numa")
    spec = pools(2, 4)
    assert not feasible_in_island(topology, [4, 2])
    ours, ray = run(topology, spec, "island-aligned"), run(topology, spec, "ray-pack")
    assert {p.pool: p.tier for p in ours.placements} == {"tp2-0": "pcie", "tp4-1": "pcie"}
    assert {p.pool: (p.gpus, p.tier) for p in ray.placements}["tp4-1"] == ((2, 3, 4, 5), "numa")
    strict = tuple(PoolSpec(name=p.name, role=p.role, tp=p.tp, replicas=1, require_island=True) for p in spec)
    refused = run(topology, strict, "island-aligned")
    assert not refused.placements and {u.pool for u in refused.unplaced} == {"tp2-0", "tp4-1"}
    assert "no island has 4 free GPUs" in refused.unplaced[1].reason or "no island has 4" in refused.unplaced[0].reason


def test_degraded_gpu_and_strict_classes_get_the_healthy_island() -> None:
    topology = read_source("configs/clusters/local-sim.yaml")
    spec = (PoolSpec(name="fast", role="mixed", tp=4, replicas=2, slo_classes=("interactive",)),
            PoolSpec(name="cheap", role="mixed", tp=4, replicas=1, slo_classes=("batch",)))
    plan = run(topology, spec, "island-aligned")
    nodes = {p.replica_id: p.node for p in plan.placements}
    assert {nodes["fast-0"], nodes["fast-1"]} <= {"h100-0", "h100-1"}
    assert nodes["cheap-0"] == "h100-degraded"


def test_pd_pairs_share_an_island() -> None:
    topology = parse_spec("nodes:\n  - {name: n, template: hgx-h100, count: 2}\n")
    spec = (PoolSpec(name="p", role="prefill", tp=4, replicas=2, model="llama-3.1-70b"),
            PoolSpec(name="d", role="decode", tp=4, replicas=2, model="llama-3.1-70b"))

    def kv_nodes(plan: PlacementPlan) -> list[tuple[str, str]]:
        nodes = {p.replica_id: p.node for p in plan.placements}
        return [(nodes["p-0"], nodes["d-0"]), (nodes["p-1"], nodes["d-1"])]

    ours = run(topology, spec, "island-aligned")
    assert all(a == b for a, b in kv_nodes(ours)), kv_nodes(ours)  # each prefill's decode in its island
    ray = run(topology, spec, "ray-pack")
    assert all(a != b for a, b in kv_nodes(ray)), kv_nodes(ray)  # prefills fill n-0, decodes n-1


def test_memory_differs_between_nodes_and_pd_units_do_not_strand_big_groups() -> None:
    mixed = parse_spec("nodes:\n  - {name: a, template: a30-pairs}\n  - {name: b, template: h100-nvl-pairs}\n")
    spec = (PoolSpec(name="chat", role="mixed", tp=1, replicas=1, slo_classes=("interactive",)),
            PoolSpec(name="big", role="mixed", tp=2, replicas=2, model="llama-3.1-70b", slo_classes=("batch",)))
    plan = run(mixed, spec, "island-aligned")
    assert not plan.unplaced and {p.node for p in plan.placements if p.pool == "big"} == {"b"}  # 94 GB cards only
    mesh = parse_spec("nodes:\n  - {name: a, template: a30-pairs}\n  - {name: b, template: dgx1-v100}\n")
    pd = (PoolSpec(name="pre", role="prefill", tp=4, replicas=2),
          PoolSpec(name="dec", role="decode", tp=2, replicas=2, slo_classes=("interactive",)))
    plan = run(mesh, pd, "island-aligned")
    assert not plan.unplaced and plan.cross_island_tp_groups == 0


def test_every_policy_is_registered_and_explains() -> None:
    topology = read_source("dgx1-v100")
    for name in POLICIES:
        plan = run(topology, pools(2, 4), name)
        assert all(p.reasons for p in plan.placements), name


def test_spread_puts_tp_groups_across_nodes() -> None:
    topology = parse_spec("nodes:\n  - {name: n, template: hgx-h100, count: 4}\n")
    plan = run(topology, pools(4), "spread")
    assert plan.placements[0].tier == "rdma" and plan.cross_island_tp_groups == 1


def test_memory_refusal_is_a_value() -> None:
    topology = read_source("rtx4090-pcie")
    plan = run(topology, pools(1, model="llama-3.1-70b"), "island-aligned")
    assert not plan.placements and "does not fit" in plan.unplaced[0].reason


def test_policy_names_are_validated(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown placement policy 'greedy'"):
        place(PlacementRequest(topology=read_source("a30-pairs"), pools=pools(1)), "greedy")


def test_groups_prefer_gpus_next_to_a_nic() -> None:
    # a30 pairs: only GPU3 has a PIX NIC; a TP=1 replica goes there when the pair choice is free
    topology = capture("a30-4gpu-nv4-bridge-pairs-1nic")
    plan = run(topology, pools(2, 1), "island-aligned")
    assert {p.pool: p.gpus for p in plan.placements} == {"tp2-0": (0, 1), "tp1-1": (3,)}
