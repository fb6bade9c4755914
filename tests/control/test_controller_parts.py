"""The controller's pure parts: pinning, node checks, marks, the rollout order, table health and
the saved state, on the shipped templates and the small test cluster in tests/data."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from control import nodecheck
from control.state import marks as health
from control.state import saved as state
from control.table import build_table
from pools.model import PlacementRequest, PoolSpec
from pools.nodelabels import node_labels, node_resources
from pools.pinning import gpu_resource, host_affinity, pin_for, visible_devices
from pools.placement import get_policy
from pools.placement.replan import Move, replan
from pools.placement.rollout import changes
from tests.conftest import ROOT
from topology import Fabric, Gpu, LinkKind, Topology, read_source
from topology.model import Node

pytestmark = pytest.mark.unit

PAIRS = str(ROOT / "tests/data/pairs-cluster.yaml")
POOL = PoolSpec(name="mixed", role="mixed", tp=2, replicas=3, model="llama-3.1-8b")


def _ray_node(topology: Topology, name: str, node_id: str, drop_label: str | None = None) -> nodecheck.RayNode:
    node = topology.node(name)
    labels = {k: v for k, v in node_labels(topology, node).items() if k != drop_label}
    return nodecheck.RayNode(node_id=node_id, labels=labels, resources=node_resources(topology, node))


def test_pin_holds_the_planned_gpus_numa_cpus_and_nearest_nic() -> None:
    topology = read_source(PAIRS)
    plan = get_policy("island-aligned").place(PlacementRequest(topology=topology, pools=(POOL,)))
    p = next(p for p in plan.placements if p.node == "b")
    ray = _ray_node(topology, "b", "ray-b")
    pin = pin_for(topology, p, ray.node_id, ray.resources)
    assert pin.ray_node_id == "ray-b" and pin.resources == {gpu_resource("b", g): 1.0 for g in p.gpus}
    assert pin.env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, p.gpus))
    assert pin.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    nic = "mlx5_0" if p.gpus == (0, 1) else "mlx5_1"
    assert pin.env["NCCL_IB_HCA"] == nic and pin.env["UCX_NET_DEVICES"] == f"{nic}:1"
    assert pin.cpus == ((0, 1) if p.gpus == (0, 1) else (2, 3)) and pin.notes == ()


def test_unbound_nodes_and_missing_resources_are_said_not_guessed() -> None:
    topology = read_source(PAIRS)
    plan = get_policy("island-aligned").place(PlacementRequest(topology=topology, pools=(POOL,)))
    p = plan.placements[0]
    loose = pin_for(topology, p, None, {})
    assert loose.ray_node_id is None and loose.resources == {} and "runs on any node" in loose.notes[0]
    partial = pin_for(topology, p, "ray-a", {gpu_resource(p.node, p.gpus[0]): 1.0})
    assert list(partial.resources) == [gpu_resource(p.node, p.gpus[0])]
    assert any("pinned by node affinity only" in n for n in partial.notes)


def test_cuda_visible_devices_follow_pci_bus_order_and_tcp_nics() -> None:
    node = Node(name="n", gpus=(Gpu(index=0, pci_bus_id="0000:C1:00.0"), Gpu(index=1, pci_bus_id="0000:41:00.0")))
    assert visible_devices(node, (0, 1)) == "1,0"
    assert visible_devices(Node(name="m", gpus=(Gpu(index=0), Gpu(index=3))), (3, 0)) == "0,3"
    box = replace(read_source("rtx4090-pcie"), fabric=Fabric(kind=LinkKind.TCP, technology="tcp-25"))
    plan = get_policy("island-aligned").place(PlacementRequest(
        topology=box, pools=(PoolSpec(name="m", role="mixed", tp=1, replicas=1, model="llama-3.1-8b"),)))
    pin = pin_for(box, plan.placements[0], None, {})
    assert pin.env["UCX_NET_DEVICES"] in ("eth0", "eth1") and "NCCL_IB_HCA" not in pin.env  # tcp fabric
    assert pin.env["NCCL_SOCKET_IFNAME"] == pin.env["UCX_NET_DEVICES"]
    on_ib = pin_for(read_source("rtx4090-pcie"), plan.placements[0], None, {})  # eth0 is no RDMA device
    assert "NCCL_IB_HCA" not in on_ib.env and on_ib.env["NCCL_SOCKET_IFNAME"] in ("eth0", "eth1")


def test_cpu_affinity_only_where_the_host_has_every_cpu() -> None:
    assert host_affinity((0, 1), frozenset({0, 1})) == ((0, 1), None)
    cpus, why = host_affinity((2, 3), frozenset({0, 1}))
    assert cpus == () and why is not None and "lacks CPUs 2-3" in why
    assert host_affinity((), frozenset({0})) == ((), None)


def test_node_check_names_missing_labels_resources_and_nodes() -> None:
    topology = read_source(PAIRS)
    a = _ray_node(topology, "a", "ray-a")
    b = _ray_node(topology, "b", "ray-b", drop_label="isle.io/islands")
    head = nodecheck.RayNode(node_id="ray-head")
    bound = nodecheck.bind(topology, [head, a, b])
    assert {k: v.node_id for k, v in bound.items()} == {"a": "ray-a", "b": "ray-b"}
    report = nodecheck.check(topology, bound, simulated=True)
    assert report.ok == ("a",) and "label isle.io/islands=2_2 missing" in report.problems["b"][0]
    by_resource = nodecheck.RayNode(node_id="r", resources={"isle_gpu_a_0": 1.0})
    assert nodecheck.bind(topology, [by_resource])["a"].node_id == "r"
    alone = nodecheck.check(topology, {"a": a}, simulated=True)
    assert "no Ray node carries it" in alone.problems["b"][0]


def test_marked_link_moves_only_its_replica_make_before_break() -> None:
    topology = read_source(PAIRS)
    plan = get_policy("island-aligned").place(PlacementRequest(topology=topology, pools=(POOL,)))
    victim = next(p for p in plan.placements if p.node == "a" and p.gpus == (0, 1))
    with pytest.raises(ValueError, match="has no link GPU0-GPU0"):
        health.check_mark(topology, "a", 0, 0)
    marked = health.effective(topology, [health.LinkMark(node="a", a=1, b=0, reason="test")], set())
    link = marked.node("a").link(0, 1)
    assert marked.fingerprint() != topology.fingerprint() and link is not None and not link.health.healthy
    assert marked.node("b") is topology.node("b")  # untouched nodes keep their objects
    result = replan(plan, marked, previous=topology)
    todo = changes({p.replica_id: p for p in plan.placements}, result.plan, result.moves)
    assert [(c.replica_id, c.order) for c in todo] == [(victim.replica_id, "make-before-break")]
    assert todo[0].new is not None and (todo[0].new.node, todo[0].new.gpus) == ("b", (2, 3))
    table = build_table(plan, marked, {p.replica_id: f"http://127.0.0.1:{9000 + i}"
                                       for i, p in enumerate(plan.placements)}, {victim.replica_id}, 7)
    row = next(r for r in table.replicas if r.replica_id == victim.replica_id)
    assert row.draining and row.health_score == 0.0 and row.healthy and table.version == 7
    assert table.topology_fingerprint == marked.fingerprint()
    lost = health.effective(topology, [], {"a"})
    assert [n.name for n in lost.nodes] == ["b"]
    assert all(not r.healthy for r in build_table(plan, lost, {p.replica_id: "http://127.0.0.1:1"
                                                              for p in plan.placements}, (), 1).replicas
               if r.node == "a")
    urls = {p.replica_id: "http://127.0.0.1:1" for p in plan.placements}  # what serves them: the spec's engine
    assert {r.engine for r in build_table(plan, topology, urls, (), 1).replicas} == {"sim"}
    assert {r.engine for r in build_table(plan, topology, urls, (), 1, engine="vllm").replicas} == {"vllm"}


def test_overlapping_gpus_stop_the_old_replica_first() -> None:
    topology = read_source(PAIRS)
    one = PoolSpec(name="m", role="mixed", tp=1, replicas=1, model="llama-3.1-8b")
    plan = get_policy("island-aligned").place(PlacementRequest(topology=topology, pools=(one,)))
    p = plan.placements[0]
    old = replace(p, gpus=(p.gpus[0], 3 - p.gpus[0]))  # it ran on a GPU the new placement needs too
    todo = changes({p.replica_id: old}, plan, (Move(replica_id=p.replica_id, before="x", after="y", reason="r"),))
    assert todo[0].order == "break-before-make"
    gone = changes({}, plan, (Move(replica_id=p.replica_id, before="unplaced", after="y", reason="was unplaced"),))
    assert gone[0].order == "start"


def test_state_round_trip(tmp_path: Path) -> None:
    topology = read_source(PAIRS)
    plan = get_policy("island-aligned").place(PlacementRequest(topology=topology, pools=(POOL,)))
    saved = state.ControllerState(
        session="s1", spec_digest="d1", plan=plan, table_version=4,
        replicas={p.replica_id: state.SavedReplica(placement=p, generation=1, url="http://127.0.0.1:1")
                  for p in plan.placements},
        retiring=(state.SavedReplica(placement=plan.placements[0], generation=0, draining=True),),
        marks=(health.LinkMark(node="a", a=0, b=1, reason="r"),), lost_nodes=("c",))
    state.save(str(tmp_path), saved)
    back = state.load(str(tmp_path), (POOL,), {})
    assert back is not None and back.plan.placements == plan.placements and back.replicas == saved.replicas
    assert back.retiring == saved.retiring and back.marks == saved.marks and back.table_version == 4
    assert state.resumable(str(tmp_path), "s1", "d1") and not state.resumable(str(tmp_path), "s2", "d1")
    state.forget(str(tmp_path))
    assert state.load(str(tmp_path), (POOL,), {}) is None


def test_discovered_nodes_merge_into_one_cluster_topology() -> None:
    from control.discovery import merge

    declared = read_source(PAIRS)
    ray_a = _ray_node(declared, "a", "ray-a")
    sim = merge(PAIRS, [(ray_a, declared.node("a"))])
    assert [n.name for n in sim.topology.nodes] == ["a", "b"] and sim.simulated
    assert {k: v.node_id for k, v in sim.bindings.items()} == {"a": "ray-a"}
    assert sim.topology.fingerprint() == declared.fingerprint()
    gpu_node = replace(declared.node("b"), name="gpu-7")
    live = merge("nvml", [(nodecheck.RayNode(node_id="ray-7"), gpu_node)])
    assert [n.name for n in live.topology.nodes] == ["gpu-7"] and not live.simulated
    assert live.bindings["gpu-7"].node_id == "ray-7"
