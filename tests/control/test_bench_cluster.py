"""The controller's topology bench on a fake two-node Ray cluster (`ray.cluster_utils.Cluster`,
two raylets on loopback declaring nodes a and b of a small 2-GPU spec): at deploy one Ray task per
node runs the node's bench with gloo, then one rank on each node measures the pair between them;
the records land in events and state with their fingerprints, and the topology routers follow
carries the measured values. A marked link (maintenance) re-runs the bench of that node and its
pair only. Small messages and two iterations: the path is what is tested, not the numbers."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import ray

from control.actors import get_or_create_controller
from control.benches.schedule import BenchPolicy
from tests.conftest import ROOT
from tests.control.conftest import controller_spec, mixed_pool
from tests.support.raycluster import fake_cluster
from tests.support.wait import START_S, wait_until
from topology import GpuRef, Topology, path, read_source
from topology.bench.record import load, node_fingerprint

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.serial,
              pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="torch is not installed (the bench extra: torch==2.13.0)")]


@dataclass
class Deployed:
    controller: Any
    state_dir: Path

    def events(self, kind: str) -> list[dict[str, Any]]:
        lines = (self.state_dir / "events.jsonl").read_text().splitlines()
        return [e for e in map(json.loads, lines) if e["kind"] == kind]

    def topology(self) -> Topology:
        found: Topology = ray.get(self.controller.topology.remote(), timeout=30)
        return found


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    work = tmp_path_factory.mktemp("bench")
    spec_path = work / "two-cpu-nodes.yaml"
    capture = ROOT / "configs/clusters/cpu-pair.txt"
    spec_path.write_text("name: two\nfabric: {technology: tcp-10}\nnodes:\n" +
                         "".join(f"  - {{name: {n}, capture: {capture}, gpu: l40s}}\n" for n in ("a", "b")))
    topology = read_source(str(spec_path))
    spec = controller_spec(work / "state", mixed_pool(1, tp=1, slo_classes=()), source=spec_path, time_scale=0.2,
                           drain_timeout_s=30.0,
                           bench=BenchPolicy(on_change=True, size_bytes=64 << 10, iters=2, timeout_s=120))
    with fake_cluster(topology, [n.name for n in topology.nodes], num_gpus=0):
        controller = get_or_create_controller(spec)
        try:
            ray.get(controller.deploy.remote(), timeout=300)
            yield Deployed(controller=controller, state_dir=work / "state")
        finally:
            ray.get(controller.shutdown.remote(), timeout=60)
            ray.kill(controller, no_restart=True)


def test_each_node_and_the_pair_between_them_are_measured_at_deploy(deployed: Deployed) -> None:
    bench = {e["subject"]: e for e in deployed.events("bench")}
    assert sorted(bench) == ["a", "a+b", "b"] and not deployed.events("bench_failed")
    assert all(e["backend"] == "gloo" and e["reason"] == "first measurement" for e in bench.values())
    topology = deployed.topology()
    assert bench["a"]["bench_fingerprint"] == node_fingerprint(topology, "a")
    a = load(bench["a"]["record"])
    assert [m.probe.name for m in a.measurements] == ["h2d a:GPU0", "d2h a:GPU0", "h2d a:GPU1", "d2h a:GPU1",
                                                      "p2p a:GPU0-GPU1", "allreduce a:GPU0-GPU1"]
    pair = load(bench["a+b"]["record"])
    assert pair.peer == "b" and [m.probe.kind for m in pair.measurements] == ["p2p", "allreduce"]
    # what routers follow: the controller's topology with the measured values in place of defaults
    nvlink = path(topology, GpuRef("a", 0), GpuRef("a", 1))
    assert nvlink.bandwidth_gb_s == pytest.approx(a.measurements[4].bandwidth_gb_s, rel=1e-3, abs=1e-4)  # files round
    between = path(topology, GpuRef("a", 1), GpuRef("b", 0))
    assert between.bandwidth_gb_s == pytest.approx(pair.measurements[0].bandwidth_gb_s, rel=1e-3, abs=1e-4)
    assert "measured" in between.via
    saved = json.loads((deployed.state_dir / "state.json").read_text())["bench"]
    assert {k: v["fingerprint"] for k, v in saved.items()} == {k: e["bench_fingerprint"] for k, e in bench.items()}
    assert all(Path(e["baseline"]).exists() for e in bench.values())


def test_maintenance_on_a_node_measures_that_node_and_its_pair_again(deployed: Deployed) -> None:
    before = len(deployed.events("bench"))
    ray.get(deployed.controller.mark_link.remote("a", 0, 1, reason="test: maintenance"), timeout=120)

    def two_new() -> list[dict[str, Any]]:  # the health loop benches on its next pass
        fresh = deployed.events("bench")[before:]
        return fresh if len(fresh) >= 2 else []

    fresh = wait_until(two_new, START_S, "two new bench records", interval_s=0.5)
    assert sorted(e["subject"] for e in fresh) == ["a", "a+b"]
    assert all(e["reason"].startswith("topology changed") for e in fresh)
    topology = deployed.topology()
    assert fresh[0]["bench_fingerprint"] == node_fingerprint(topology, "a") != \
        deployed.events("bench")[0]["bench_fingerprint"]
