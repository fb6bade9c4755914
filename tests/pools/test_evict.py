"""Re-placing one replica on purpose (pools.placement.evict): off its GPUs and their NICs where
room allows, off its GPUs alone when not, nowhere when no GPUs are free; every other replica stays."""

from __future__ import annotations

from pathlib import Path

import pytest

from pools.model import PlacementPlan, PlacementRequest, PoolSpec
from pools.placement import get_policy
from pools.placement.evict import evict, nic_neighbours
from pools.placement.rollout import changes
from tests.conftest import ROOT
from topology import GpuRef, Topology, read_source

pytestmark = pytest.mark.unit


def pd_plan(decodes: int) -> tuple[Topology, PlacementPlan]:
    """The pair nodes (4x A30 each: NVLink pairs 0-1 and 2-3, one InfiniBand NIC per pair)."""
    topology = read_source(str(ROOT / "tests/data/pairs-cluster.yaml"))
    pools = (PoolSpec(name="prefill", role="prefill", tp=2, replicas=1, model="llama-3.1-8b"),
             PoolSpec(name="decode", role="decode", tp=2, replicas=decodes, model="llama-3.1-8b"))
    return topology, get_policy("island-aligned").place(PlacementRequest(topology=topology, pools=pools))


def where(plan: PlacementPlan) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {p.replica_id: (p.node, p.gpus) for p in plan.placements}


def test_moves_off_its_gpus_and_nics_and_nothing_else() -> None:
    topology, plan = pd_plan(2)
    before = where(plan)
    found = evict(plan, topology, "decode-0", "test: wrong path")
    assert found.replan is not None and found.why == f"off its GPUs and their NICs ({before['decode-0'][0]}:mlx5_1)"
    after = where(found.replan.plan)
    assert after["decode-0"] != before["decode-0"]
    assert {k: x for k, x in after.items() if k != "decode-0"} == {k: x for k, x in before.items() if k != "decode-0"}
    near, _ = nic_neighbours(topology, plan.placements[1])
    assert not {GpuRef(after["decode-0"][0], g) for g in after["decode-0"][1]} & near
    (move,) = changes({p.replica_id: p for p in plan.placements}, found.replan.plan, found.replan.moves)
    assert (move.replica_id, move.order, move.reason) == ("decode-0", "make-before-break", "test: wrong path")


def test_no_free_gpus_is_a_value() -> None:
    topology, plan = pd_plan(3)  # every GPU pair taken
    found = evict(plan, topology, "decode-0", "test")
    assert found.replan is None and found.why == "no free GPUs for decode-0 off its own"
    with pytest.raises(ValueError, match="no replica 'decode-9'"):
        evict(plan, topology, "decode-9", "test")


def test_off_its_nic_where_room_allows_else_off_its_gpus(tmp_path: Path) -> None:
    """An 8x RTX 4090 box: NIC eth0 nearest GPUs 0-3, eth1 nearest 4-7; three TP-2 replicas."""
    spec = tmp_path / "box.yaml"
    spec.write_text("name: box\nfabric: {technology: ib-ndr}\nnodes:\n  - {name: box, template: rtx4090-pcie}\n")
    topology = read_source(str(spec))
    pools = (PoolSpec(name="decode", role="decode", tp=2, replicas=3, model="llama-3.1-8b"),)
    plan = get_policy("island-aligned").place(PlacementRequest(topology=topology, pools=pools))
    assert {rid: gpus for rid, (_, gpus) in where(plan).items()} == {
        "decode-0": (0, 1), "decode-1": (2, 3), "decode-2": (4, 5)}
    away = evict(plan, topology, "decode-0", "test")  # GPUs 6-7 sit behind eth1
    assert away.replan is not None and where(away.replan.plan)["decode-0"] == ("box", (6, 7))
    assert away.why == "off its GPUs and their NICs (box:eth0)"
    near = evict(plan, topology, "decode-2", "test")  # the only free GPUs share its NIC
    assert near.replan is not None and where(near.replan.plan)["decode-2"] == ("box", (6, 7))
    assert near.why == "off its GPUs (no room away from their NICs)"
