"""The controller's autoscaler with real engine processes and no Ray, on a clock the test moves:
load reports as the router sends them make a decode pool grow (new replicas placed inside
NVLink pairs, started and published once up) and shrink (the replica leaves the table at once and
stops once idle), with every decision's reason in the status and the event log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from control.backend import LocalBackend
from control.controller import ControllerCore
from control.spec import AutoscaleSpec, ControllerSpec
from pools.autoscale.policy import AutoscalingConfig
from pools.model import PoolSpec
from tests.conftest import ROOT

pytestmark = pytest.mark.integration
PAIRS = str(ROOT / "tests/data/pairs-cluster.yaml")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _spec(tmp_path: Path) -> ControllerSpec:
    cfg = AutoscalingConfig(min_replicas=1, max_replicas=3, target_ongoing_requests=2, upscale_delay_s=0,
                            downscale_delay_s=10, cooldown_s=0, sizing_slo_share=None)
    return ControllerSpec(
        topology_source=PAIRS, engine="sim", policy="island-aligned", time_scale=0.05, state_dir=str(tmp_path),
        counters_interval_s=0, drain_timeout_s=5,
        pools=(PoolSpec(name="prefill", role="prefill", tp=2, replicas=1, model="llama-3.1-8b"),
               PoolSpec(name="decode", role="decode", tp=2, replicas=1, model="llama-3.1-8b")),
        autoscale=AutoscaleSpec(pools={"decode": cfg}, interval_s=1.0, look_back_s=2.0, window_s=10.0,
                                drain_timeout_s=60.0))


def _report(running: float, sent: int, inflight: dict[str, int] | None = None) -> dict[str, Any]:
    return {"buckets": [0.1, 1.0], "pools": {"decode": {"running": running, "waiting": 0.0, "sent": sent,
                                                        "inflight": inflight or {}}},
            "ttft": [], "tpot": [["interactive", "decode", [3, 1, 0]]]}


def test_reports_grow_and_shrink_the_decode_pool_inside_islands(tmp_path: Path) -> None:
    clock = Clock()
    core = ControllerCore(_spec(tmp_path), LocalBackend(), clock=clock)
    try:
        core.deploy()
        assert sorted(r.replica_id for r in core.table.replicas) == ["decode-0", "prefill-0"]
        assert core.observe("not a report")["pools"]["decode"]["placed"] == 1  # ignored, said in the log
        clock.now += 1.0
        core.observe(_report(running=7.0, sent=40))
        status = core.observe(_report(running=7.0, sent=40))
        assert status["pools"]["decode"] == {**status["pools"]["decode"], "placed": 1, "serving": 1, "min": 1,
                                             "max": 3}
        clock.now += 1.0
        core.observe(_report(running=7.0, sent=50))
        core.check()  # 7 in flight, 2 per replica: 4 wanted, capped at 3
        plan = core.plan
        assert plan is not None and plan.pool("decode").replicas == 3
        new = [p for p in plan.placements if p.pool == "decode" and p.replica_id != "decode-0"]
        assert len(new) == 2 and all(p.in_island and p.tier == "nvlink" for p in new)
        taken = [ref for p in plan.placements for ref in p.gpu_refs()]
        assert len(taken) == len(set(taken)) == 8  # every pair of both nodes, none twice
        assert set(core.status()["starting"]) == {p.replica_id for p in new}
        table = core.settle(timeout_s=60)
        assert sorted(r.replica_id for r in table.replicas if r.pool == "decode") == ["decode-0", "decode-1",
                                                                                      "decode-2"]
        for p in new:  # each runs where the plan says
            running = core.running[p.replica_id]
            assert (running.launch.node, running.launch.gpus) == (p.node, p.gpus)
        assert core.status()["autoscaling"]["pools"]["decode"]["wanted"] == 3
        decision = core.status()["autoscaling"]["decisions"][-1]
        assert decision["delta"] == 2 and decision["reason"].startswith("scale out 1 -> 3")
        assert [x["replica_id"] for x in decision["placed"]] == [p.replica_id for p in new]

        # the load goes: after the downscale delay (the look-back still held some load: two steps)
        # the pool shrinks to its minimum, the busiest replica stays
        busy = {"decode-0": 0, "decode-1": 3, "decode-2": 0}
        leaving = [core.running[rid].replica for rid in ("decode-0", "decode-2")]
        for _ in range(25):
            clock.now += 1.0
            core.observe(_report(running=0.0, sent=50, inflight=busy))
            core.check()
        assert core.plan is not None and core.plan.pool("decode").replicas == 1
        assert [p.replica_id for p in core.plan.placements if p.pool == "decode"] == ["decode-1"]
        assert sorted(r.replica_id for r in core.table.replicas if r.pool == "decode") == ["decode-1"]
        assert core.retiring == [] and not any(r.healthy() for r in leaving)  # idle after the grace: stopped
        events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
        scaled = [e for e in events if e["kind"] == "autoscale"]
        assert scaled[0]["delta"] == 2 and sum(e["delta"] for e in scaled[1:]) == -2
        assert [rid for e in scaled[1:] for rid in e["removed"]] == ["decode-0", "decode-2"]
        assert all(e["reason"].startswith("scale in") and "requests in flight" in e["reason"] for e in scaled[1:])
        assert {e["replica_id"] for e in events if e["kind"] == "stopped"} == {"decode-0", "decode-2"}
        auto = core.status()["autoscaling"]["pools"]["decode"]
        assert (auto["placed"], auto["wanted"], auto["scaled_out"], auto["scaled_in"]) == (1, 1, 1, len(scaled) - 1)
    finally:
        core.shutdown()


def test_a_replica_whose_start_was_lost_leaves_the_plan(tmp_path: Path) -> None:
    """A scale-out whose start never comes up (it failed, or a restarted controller stopped it)
    does not keep its GPUs and its place in the count for good."""
    clock = Clock()
    core = ControllerCore(_spec(tmp_path), LocalBackend(), clock=clock)
    try:
        core.deploy()
        for sent in (40, 50):
            clock.now += 1.0
            core.observe(_report(running=7.0, sent=sent))
        core.check()
        assert core.plan is not None and core.plan.pool("decode").replicas == 3
        core.fleet.starts.drop("decode-2", "test: the start failed")
        core.settle(timeout_s=60)
        clock.now += 1.0
        core.observe(_report(running=1.0, sent=50))
        core.check()  # the next decision first forgets the lost start
        assert core.plan.pool("decode").replicas == 2
        assert sorted(p.replica_id for p in core.plan.placements if p.pool == "decode") == ["decode-0", "decode-1"]
        events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
        assert [e["replica_id"] for e in events if e["kind"] == "autoscale_start_lost"] == ["decode-2"]
    finally:
        core.shutdown()
