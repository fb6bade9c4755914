"""The controller's side of the proof of the path (issue 34), with real engine processes and no
Ray: the router's KV-path verdicts become `kv_path` events, a decode replica whose pair stays on
the wrong path is re-placed make-before-break (on its own with `kv_path_action: replace`, or when
told), and an engine started with transport variables that contradict its plan is reported
before the routing table lists it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from control.controller import ControllerCore
from control.replicas.sim import ReplicaProcess
from pools.kvrepair import KvPathAction
from pools.model import PoolSpec
from tests.control.conftest import FakeBackend, controller_spec, events, health_status
from tests.control.test_autoscale import Clock

pytestmark = pytest.mark.integration
Engines = FakeBackend[ReplicaProcess]
PD = (PoolSpec(name="prefill", role="prefill", tp=2, replicas=1, model="llama-3.1-8b"),
      PoolSpec(name="decode", role="decode", tp=2, replicas=2, model="llama-3.1-8b"))
"""Three of the pair nodes' four NVLink pairs: one pair (and its NIC) stays free."""


def report(verdict: str, decode: str = "decode-0") -> dict[str, Any]:
    """The router's load report as it sends it, with one pair's verdict."""
    return {"kv_paths": [{"prefill": "prefill-0", "decode": decode, "verdict": verdict, "tier": "rdma",
                          "measured_gb_s": 11.8 if verdict != "as_planned" else 24.0, "expected_gb_s": 25.0,
                          "samples": 12, "avoided": verdict != "as_planned"}]}


def test_a_pair_on_the_wrong_path_is_an_event_then_its_decode_moves(tmp_path: Path, engines: Engines) -> None:
    clock = Clock()
    spec = controller_spec(tmp_path, *PD, kv_path_action=KvPathAction(action="replace", after_s=30.0))
    core = ControllerCore(spec, engines, clock=clock)
    core.deploy()
    old = core.running["decode-0"]
    core.observe(report("wrong_path"))
    core.check()
    (event,) = events(tmp_path, "kv_path")
    assert {k: event[k] for k in ("pair", "old", "new", "measured_gb_s", "expected_gb_s")} == {
        "pair": "prefill-0->decode-0", "old": "as_planned", "new": "wrong_path", "measured_gb_s": 11.8,
        "expected_gb_s": 25.0}
    assert "signature of a slower link" in event["why"] and not old.draining
    assert core.status()["kv_paths"]["not_as_planned"] == {"prefill-0->decode-0": "wrong_path"}
    clock.now += 31.0
    core.observe(report("wrong_path"))
    core.check()  # bad for 31 s: re-placed, make-before-break
    (action,) = events(tmp_path, "kv_path_action")
    assert action["result"] == "re-placed" and [m["order"] for m in action["moves"]] == ["make-before-break"]
    assert old.draining and core.running["decode-0"] is old
    core.settle(timeout_s=30)
    new = core.running["decode-0"]
    assert new is not old and not new.draining and health_status(new.url) == 200
    assert not set(new.placement.gpu_refs()) & set(old.placement.gpu_refs())
    nic = (new.placement.node, new.launch.pin.env["NCCL_IB_HCA"])
    assert nic != (old.placement.node, old.launch.pin.env["NCCL_IB_HCA"])  # another NIC
    (replaced,) = events(tmp_path, "replace")
    assert replaced["where"].startswith("off its GPUs and their NICs")
    clock.now += 60.0
    core.observe(report("wrong_path"))  # the router's old pair, before it follows the table
    core.check()
    assert len(events(tmp_path, "kv_path_action")) == 1  # cooling down: not moved again
    core.shutdown()


def test_replace_on_command_and_when_it_cannot(tmp_path: Path, engines: Engines) -> None:
    core = ControllerCore(controller_spec(tmp_path, *PD), engines)
    core.deploy()
    old = core.running["decode-1"]
    moves = core.replace_replica("decode-1", "operator: wrong path seen in isle status")
    assert [(m["replica_id"], m["order"]) for m in moves] == [("decode-1", "make-before-break")]
    with pytest.raises(ValueError, match="not serving steadily"):
        core.replace_replica("decode-1")  # already moving
    core.settle(timeout_s=30)
    assert core.running["decode-1"] is not old
    with pytest.raises(ValueError, match="no free GPUs"):  # the old one still holds the last free pair
        core.replace_replica("decode-0")
    with pytest.raises(ValueError, match="not serving steadily"):
        core.replace_replica("decode-7")
    kinds = [e["kind"] for e in events(tmp_path)]
    assert kinds.count("replace") == 2 and "move" in kinds
    core.shutdown()


def test_an_engine_on_tcp_against_an_rdma_plan_is_reported_before_it_is_published(
        tmp_path: Path, engines: Engines, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UCX_TLS", "tcp,cuda_copy")  # as a node's or a runtime env's setting would reach it
    monkeypatch.setenv("NCCL_IB_DISABLE", "1")
    core = ControllerCore(controller_spec(tmp_path, *PD), engines)
    core.deploy()
    found = events(tmp_path, "transport_env")
    assert {(e["replica_id"], e["variable"], e["actual"]) for e in found} == {
        (rid, var, val) for rid in ("prefill-0", "decode-0", "decode-1")
        for var, val in (("UCX_TLS", "tcp,cuda_copy"), ("NCCL_IB_DISABLE", "1"))}
    assert all(e["planned"] is None and e["rdma"] for e in found)
    kinds = [e["kind"] for e in events(tmp_path)]
    assert max(i for i, k in enumerate(kinds) if k == "transport_env") < kinds.index("routing_table")
    shown = core.status()["transport_env"]
    assert sorted(shown) == ["decode-0", "decode-1", "prefill-0"]
    assert [(e["variable"], e["why"]) for e in shown["decode-0"]] == [
        ("UCX_TLS", "no RDMA transport (rc, ud, dc, ib) on an RDMA plan: UCX, and NIXL over it, move the KV cache "
                    "over TCP"),
        ("NCCL_IB_DISABLE", "NCCL does not use IB/RoCE and falls back to IP sockets on an RDMA plan")]
    core.shutdown()
