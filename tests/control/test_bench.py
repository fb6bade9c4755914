"""The controller's topology benches: what is due when (first deploy, a marked link, a node lost
and back, the schedule), the records and baselines it keeps, the drop below a baseline it
reports, and the measured values it feeds to the cost model (links and node pairs), with a
backend whose bench returns chosen figures; then the local bench path for real (gloo)."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from control.backend import Discovery, LocalBackend
from control.benches.local import bench_here, rounds
from control.benches.schedule import BenchPolicy, Measured, Subject, due, subjects
from control.controller import ControllerCore
from control.nodecheck import RayNode
from control.spec import ControllerSpec
from pools.model import PoolSpec
from tests.conftest import ROOT
from topology import GpuRef, Topology, path, read_source
from topology.bench.plan import plan_between, plan_probes
from topology.bench.record import BenchRecord, Measurement, node_fingerprint, pair_fingerprint
from topology.bench.run import BenchSettings

pytestmark = pytest.mark.unit

PAIRS = str(ROOT / "tests/data/pairs-cluster.yaml")


def _events(tmp_path: Path, kind: str | None = None) -> list[dict[str, Any]]:
    found = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    return [e for e in found if kind is None or e["kind"] == kind]


class BenchBackend(LocalBackend):
    """Two nodes bound to Ray nodes whose ids the test changes; the bench returns `gb_s` times a
    per-probe figure, and remembers what it was asked."""

    def __init__(self) -> None:
        self.ray_ids = {"a": "ray-a", "b": "ray-b"}
        self.gb_s = 10.0
        self.asked: list[list[str]] = []

    def session(self) -> str:
        return "test-session"

    def discover(self, source: str) -> Discovery:
        found = super().discover(source)
        bound = {n: RayNode(node_id=i) for n, i in self.ray_ids.items() if i}
        return Discovery(topology=found.topology, bindings=bound, simulated=True)

    def nodes(self) -> list[RayNode] | None:
        return [RayNode(node_id=i) for i in self.ray_ids.values() if i]

    def bench(self, topology: Topology, due: Sequence[Subject], settings: BenchSettings, source: str
              ) -> dict[str, BenchRecord | str]:
        assert settings.backend == "gloo"  # simulated nodes: the path, not the numbers
        self.asked.append([s.key for s in due])
        return {s.key: self._record(topology, s) for s in due}

    def _record(self, topology: Topology, s: Subject) -> BenchRecord:
        if len(s.nodes) == 1:
            probes, fp, peer = plan_probes(topology, s.nodes[0]), node_fingerprint(topology, s.nodes[0]), None
        else:
            probes, fp, peer = plan_between(topology, *s.nodes), pair_fingerprint(topology, *s.nodes), s.nodes[1]
        return BenchRecord(fingerprint=fp, source="test", node=s.nodes[0], peer=peer, backend="gloo", device="cpu",
                           started_at="2026-01-01T00:00:00+00:00", measurements=tuple(
                               Measurement(probe=p, size_bytes=1 << 20, bandwidth_gb_s=self.gb_s * (i + 1),
                                           latency_us=7.0, iters=2) for i, p in enumerate(probes)))


def _spec(tmp_path: Path, **bench: Any) -> ControllerSpec:
    return ControllerSpec(topology_source=PAIRS, engine="sim", policy="island-aligned", time_scale=0.05,
                          state_dir=str(tmp_path), counters_interval_s=0, drain_timeout_s=5,
                          pools=(PoolSpec(name="mixed", role="mixed", tp=2, replicas=1, model="llama-3.1-8b"),),
                          bench=BenchPolicy(**bench))


@pytest.mark.unit
def test_subjects_are_the_bound_nodes_and_a_ring_of_pairs() -> None:
    t = read_source("tests/data/pairs-cluster.yaml")
    bound = {"a": RayNode(node_id="r1"), "b": RayNode(node_id="r2")}
    assert [(s.key, s.ray_ids) for s in subjects(t, bound)] == [("a", ("r1",)), ("b", ("r2",)),
                                                                ("a+b", ("r1", "r2"))]
    assert [s.key for s in subjects(t, {"a": bound["a"]})] == ["a"]
    assert [s.key for s in subjects(t, {}, everywhere=True)] == ["a", "b", "a+b"]
    ring = [Subject(key=k, nodes=tuple(k.split("+")), fingerprint="") for k in ("a+b", "b+c", "c+d", "a+d")]
    assert [[s.key for s in r] for r in rounds(ring)] == [["a+b", "c+d"], ["b+c", "a+d"]]


@pytest.mark.unit
@pytest.mark.parametrize(("policy", "last", "now", "reason"), [
    (BenchPolicy(), None, 0.0, None),  # off
    (BenchPolicy(on_change=True), None, 0.0, "first measurement"),
    (BenchPolicy(interval_s=60), None, 0.0, "first measurement"),
    (BenchPolicy(on_change=True), Measured(fingerprint="f", ray_ids=("r",), at=0), 1e6, None),
    (BenchPolicy(on_change=True), Measured(fingerprint="old", ray_ids=("r",), at=0), 1.0,
     "topology changed (old -> f)"),
    (BenchPolicy(on_change=True), Measured(fingerprint="f", ray_ids=("r0",), at=0), 1.0, "Ray node replaced or back"),
    (BenchPolicy(interval_s=60), Measured(fingerprint="old", ray_ids=("r0",), at=0), 59.0, None),
    (BenchPolicy(interval_s=60), Measured(fingerprint="f", ray_ids=("r",), at=0), 60.0, "scheduled (every 60 s)"),
])
def test_what_is_due_and_why(policy: BenchPolicy, last: Measured | None, now: float, reason: str | None) -> None:
    s = Subject(key="a", nodes=("a",), fingerprint="f", ray_ids=("r",))
    got = due(policy, now, [s], {"a": last} if last else {})
    assert [why for _, why in got] == ([reason] if reason else [])


@pytest.mark.integration
def test_benches_before_planning_and_feed_the_cost_model(tmp_path: Path) -> None:
    backend = BenchBackend()
    core = ControllerCore(_spec(tmp_path, on_change=True), backend)
    try:
        core.deploy()
        assert backend.asked == [["a", "b", "a+b"]]
        kinds = [e["kind"] for e in _events(tmp_path)]
        assert kinds.index("bench") < kinds.index("plan") and kinds.count("bench") == 3
        assert core.topology is not None and core.plan is not None
        assert core.plan.topology_fingerprint == core.topology.fingerprint()  # measuring changes no structure
        nvlink = next(m for m in core.bench.records["a"].measurements if m.probe.link == "nvlink x4")
        assert path(core.topology, GpuRef("a", 2), GpuRef("a", 3)).bandwidth_gb_s == nvlink.bandwidth_gb_s
        between = path(core.topology, GpuRef("a", 1), GpuRef("b", 2))
        assert between.bandwidth_gb_s == 10.0 and "measured" in between.via
        bench = {e["subject"]: e for e in _events(tmp_path, "bench")}
        assert bench["a"]["bench_fingerprint"] == node_fingerprint(core.topology, "a") and bench["a"]["fingerprint"]
        assert Path(bench["a+b"]["record"]).exists() and Path(bench["a+b"]["baseline"]).exists()
        saved = json.loads((tmp_path / "state.json").read_text())["bench"]
        assert sorted(saved) == ["a", "a+b", "b"] and all(v["ok"] and v["record"] for v in saved.values())
        version = core.table.version
        assert core.check().version == version and len(backend.asked) == 1  # nothing changed: nothing run
    finally:
        core.shutdown()


@pytest.mark.integration
def test_a_marked_link_a_drop_and_the_schedule(tmp_path: Path) -> None:
    backend, now = BenchBackend(), [0.0]
    core = ControllerCore(_spec(tmp_path, on_change=True, interval_s=3600), backend, clock=lambda: now[0])
    try:
        core.deploy()
        core.mark_link("b", 2, 3, reason="maintenance")
        table = core.check()
        assert backend.asked[-1] == ["b", "a+b"]  # node b changed, and so did the pair with it
        assert _events(tmp_path, "bench")[-1]["reason"].startswith("topology changed")
        assert table.version > 1  # published, so routers follow to the measured topology
        backend.gb_s, now[0] = 5.0, 3600.0  # everything at half its bandwidth an hour later
        core.check()
        assert backend.asked[-1] == ["a", "b", "a+b"]
        drops = {e["subject"]: e["below_baseline"] for e in _events(tmp_path, "bench_regression")}
        assert sorted(drops) == ["a", "a+b", "b"]
        assert "measured 10 -> 5 GB/s (-50%)" in drops["a+b"][0]
        assert core.status()["bench"]["a"]["below_baseline"]
        assert core.topology is not None and path(core.topology, GpuRef("a", 0), GpuRef("b", 0)).bandwidth_gb_s == 5.0
    finally:
        core.shutdown()


@pytest.mark.integration
def test_a_node_that_joins_is_measured(tmp_path: Path) -> None:
    backend = BenchBackend()
    backend.ray_ids["b"] = ""  # no Ray node carries b yet
    core = ControllerCore(_spec(tmp_path, on_change=True), backend)
    try:
        core.deploy()
        assert backend.asked == [["a"]]
        backend.ray_ids["b"] = "ray-b"  # scale-out: a Ray node for b starts
        core.check()
        assert backend.asked[-1] == ["b", "a+b"] and set(core.bench.records) == {"a", "b", "a+b"}
        assert _events(tmp_path, "bench")[-1]["reason"] == "first measurement"
    finally:
        core.shutdown()


@pytest.mark.integration
def test_a_node_lost_and_back_is_measured_again_and_a_new_controller_keeps_the_records(tmp_path: Path) -> None:
    backend = BenchBackend()
    core = ControllerCore(_spec(tmp_path, on_change=True), backend)
    try:
        core.deploy()
        backend.ray_ids["b"] = ""
        core.check()
        assert core.lost == {"b"} and "b" not in core.bench.records and "a+b" not in core.bench.records
        backend.ray_ids["b"] = "ray-b2"  # back, as a new Ray node
        core.check()
        assert core.lost == set() and backend.asked[-1] == ["b", "a+b"]
        assert any(e["kind"] == "nodes_joined" and e["back"] == ["b"] for e in _events(tmp_path))
        asked = len(backend.asked)
        again = ControllerCore(_spec(tmp_path, on_change=True), backend)  # the actor restarted
        try:
            again.deploy()
            assert again.topology is not None and len(backend.asked) == asked  # restored, not measured again
            assert path(again.topology, GpuRef("a", 0), GpuRef("b", 0)).bandwidth_gb_s == 10.0
        finally:
            again.shutdown()
    finally:
        core.shutdown()


@pytest.mark.integration
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed (the bench extra)")
def test_the_local_bench_measures_a_node_and_a_pair_on_loopback() -> None:
    t = read_source(str(ROOT / "configs/clusters/cpu-pair.yaml"))
    two = replace(t, nodes=(t.nodes[0], replace(t.nodes[0], name="cpu2")))
    todo = subjects(two, {}, everywhere=True)
    got = bench_here(two, [s for s in todo if s.key in ("cpu", "cpu+cpu2")],
                     BenchSettings(backend="gloo", size_bytes=1 << 16, iters=2, timeout_s=120), "test")
    node, pair = got["cpu"], got["cpu+cpu2"]
    assert isinstance(node, BenchRecord) and isinstance(pair, BenchRecord), got
    assert node.fingerprint == node_fingerprint(two, "cpu") and pair.peer == "cpu2"
    assert [m.probe.name for m in pair.measurements] == ["p2p cpu:GPU0-cpu2:GPU0", "allreduce cpu:GPU0-cpu2:GPU0"]
    assert all(m.bandwidth_gb_s > 0 and m.latency_us > 0 for m in (*node.measurements, *pair.measurements))


class FailingBenchBackend(BenchBackend):
    def bench(self, topology: Topology, due: Sequence[Subject], settings: BenchSettings, source: str
              ) -> dict[str, BenchRecord | str]:
        self.asked.append([s.key for s in due])
        raise RuntimeError("torch is not installed on node a")


@pytest.mark.integration
def test_a_failed_bench_neither_fails_the_deploy_nor_repeats_every_pass(tmp_path: Path) -> None:
    backend = FailingBenchBackend()
    core = ControllerCore(_spec(tmp_path, on_change=True), backend)
    try:
        assert core.deploy().replicas
        failed = _events(tmp_path, "bench_failed")
        assert [e["subject"] for e in failed] == ["a", "b", "a+b"] and "torch is not installed" in failed[0]["error"]
        core.check()
        assert len(backend.asked) == 1 and not core.bench.records
    finally:
        core.shutdown()
