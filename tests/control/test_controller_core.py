"""The controller's logic with real engine processes and no Ray: plan, start, table, restart,
drain and re-place on a marked link, resume from the saved state."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from control.backend import LocalBackend
from control.controller import ControllerCore
from control.replicas.sim import ReplicaProcess
from tests.conftest import ROOT
from tests.control.conftest import FakeBackend, controller_spec, engine_backend, events, health_status, mixed_pool

pytestmark = pytest.mark.integration


Engines = FakeBackend[ReplicaProcess]


def test_deploy_publish_and_restart_a_dead_engine(tmp_path: Path) -> None:
    core = ControllerCore(controller_spec(tmp_path, source=ROOT / "configs/clusters/local-sim.yaml"), LocalBackend())
    try:
        table = core.deploy()
        assert table.version == 1 and {r.replica_id for r in table.replicas} == {"mixed-0", "mixed-1"}
        for r in table.replicas:
            assert r.gpu_model == "h100-sxm" and r.tier == "nvlink" and len(r.gpus) == 2 and health_status(r.url) == 200
        victim = core.running["mixed-0"].replica
        assert isinstance(victim, ReplicaProcess) and victim.proc is not None
        victim.proc.kill()
        victim.proc.wait(5)
        assert core.check().version == 1 and core.status()["starting"] == {"mixed-0": "restart"}  # submitted ...
        table = core.settle(timeout_s=30)  # ... and installed once up
        assert table.version == 2 and victim.restarts == 1 and core.status()["starting"] == {}
        assert health_status(next(r.url for r in table.replicas if r.replica_id == "mixed-0")) == 200
        # started on a worker thread, the engine outlives its start (it dies with the thread that
        # started it, PR_SET_PDEATHSIG): the worker waits for the next start instead of ending
        with pytest.raises(subprocess.TimeoutExpired):
            victim.proc.wait(1.0)
        kinds = [e["kind"] for e in events(tmp_path)]
        assert kinds[:2] == ["topology", "plan"] and "restart" in kinds
    finally:
        procs = [r.replica.proc for r in core.running.values() if isinstance(r.replica, ReplicaProcess)]
        core.shutdown()
    assert all(p is not None and p.poll() is not None for p in procs)  # every engine stopped


def test_marked_link_drains_then_replaces_before_stopping(tmp_path: Path, engines: Engines) -> None:
    core = ControllerCore(controller_spec(tmp_path), engines)
    core.deploy()
    victim = next(rid for rid, r in core.running.items() if (r.placement.node, r.placement.gpus) == ("a", (0, 1)))
    old = core.running[victim]
    moves = core.mark_link("a", 0, 1, reason="test: NVLink down")
    assert [(m["replica_id"], m["order"], m["to"]) for m in moves] == [(victim, "make-before-break", "b:0,b:1")]
    assert core.running[victim] is old and old.draining  # drained at once, replaced once the new one is up
    core.settle(timeout_s=30)
    new = core.running[victim]
    assert new.url != old.url and not new.draining and health_status(new.url) == 200
    assert core.topology is not None and core.table.topology_fingerprint == core.topology.fingerprint()
    assert health_status(old.url) == 200  # the old one still finishes what it has ...
    core.check()  # ... and stops once idle
    assert isinstance(old.replica, ReplicaProcess) and old.replica.proc is not None
    assert old.replica.proc.poll() is not None and not core.retiring
    found = events(tmp_path)
    drained = next(i for i, e in enumerate(found) if e["kind"] == "drain")
    table_after_drain = found[drained + 1]
    assert table_after_drain["kind"] == "routing_table" and table_after_drain["draining"] == [victim]
    started = next(i for i, e in enumerate(found) if e["kind"] == "replica_started" and e["generation"] == 1)
    stopped = next(i for i, e in enumerate(found) if e["kind"] == "stopped")
    assert drained < started < stopped  # make before break
    assert all(e["fingerprint"] for e in found) and len({e["fingerprint"] for e in found}) == 2
    with pytest.raises(ValueError, match="no link GPU0-GPU9"):
        core.mark_link("a", 0, 9)


def test_a_new_controller_resumes_instead_of_starting_duplicates(tmp_path: Path, engines: Engines) -> None:
    first = ControllerCore(controller_spec(tmp_path), engines)
    first.deploy()
    first.mark_link("a", 0, 1)
    first.settle(timeout_s=30)
    first.check()
    before = {rid: (r.url, r.placement) for rid, r in first.running.items()}
    version = first.table.version
    second = ControllerCore(controller_spec(tmp_path), engines)  # the actor restarted: same spec, same state_dir
    table = second.deploy()
    assert {rid: (r.url, r.placement) for rid, r in second.running.items()} == before
    assert table.version == version + 1 and len(engines.by_name) == 3  # two replicas, one replaced: no new one
    assert second.marks == first.marks and second.topology is not None and first.topology is not None
    assert second.topology.fingerprint() == first.topology.fingerprint()
    assert events(tmp_path)[-2]["kind"] == "resumed"
    other = ControllerCore(controller_spec(tmp_path, mixed_pool(1)), engines)  # other settings: a fresh deployment
    assert not other._resume()


def test_a_lost_node_moves_its_replicas(tmp_path: Path) -> None:
    backend = engine_backend(nodes=("a", "b"))  # bound to two (listed, not running) Ray nodes
    core = ControllerCore(controller_spec(tmp_path), backend)
    try:
        core.deploy()
        assert {r.placement.node for r in core.running.values()} == {"a"}
        version = core.table.version
        assert core.check().version == version  # nothing changed: nothing published
        backend.alive["a"] = False
        core.check()
        table = core.settle(timeout_s=30)
        assert {r.node for r in table.replicas} == {"b"} and all(r.healthy and not r.draining for r in table.replicas)
        assert all(health_status(r.url) == 200 for r in table.replicas)
        topo = next(e for e in events(tmp_path) if e["kind"] == "topology" and e["reason"] != "deploy")
        assert topo["reason"] == "Ray node gone: a" and topo["lost_nodes"] == ["a"]
        assert core.status()["lost_nodes"] == ["a"]
    finally:
        core.shutdown()
        backend.stop_all()


def test_a_node_lost_while_a_discovery_ran_is_still_lost(tmp_path: Path) -> None:
    """The Ray node dies, then a discovery (a counters pass, a join) runs before the loop looks at
    the nodes: the discovery no longer binds it, but the node is lost all the same (found by the
    chaos run: a restart in flight let a counters pass come first, and the lost node stayed in
    the table)."""
    backend = engine_backend(nodes=("a", "b"))  # bound to two (listed, not running) Ray nodes
    core = ControllerCore(controller_spec(tmp_path), backend)
    try:
        core.deploy()
        backend.alive["a"] = False
        core._discover()  # what a counters pass does first
        assert "a" not in core.bindings
        core.check()
        table = core.settle(timeout_s=30)
        assert core.status()["lost_nodes"] == ["a"] and {r.node for r in table.replicas} == {"b"}
    finally:
        core.shutdown()
        backend.stop_all()


def test_a_replica_restarted_as_its_node_dies_stays_pinned_there(tmp_path: Path) -> None:
    """The Ray node dies and a discovery unbinds it before the loop calls it lost; a restart
    built then must keep the dead node's pin (and fail there), not run on any node under the
    lost node's name (found by the chaos run: tokens kept coming from "the lost node")."""
    backend = engine_backend(nodes=("a", "b"))
    core = ControllerCore(controller_spec(tmp_path), backend)
    try:
        core.deploy()
        rid, running = next((rid, r) for rid, r in core.running.items() if r.placement.node == "a")
        pinned = running.launch.pin.ray_node_id
        assert pinned is not None
        backend.alive["a"] = False
        core._discover()
        assert "a" not in core.bindings
        fresh = core._launch(running.placement, core.fleet.generation(rid))
        assert fresh.pin.ray_node_id == pinned and not any("runs on any node" in n for n in fresh.pin.notes)
    finally:
        core.shutdown()
        backend.stop_all()


def _pairs_spec(path: Path, degraded: str) -> None:
    capture = ROOT / "tests/data/pairs-4gpu.txt"
    path.write_text(f"name: pairs\nfabric: {{technology: ib-hdr}}\nnodes:\n"
                    f"  - {{name: a, capture: {capture}, gpu: a30{degraded}}}\n"
                    f"  - {{name: b, capture: {capture}, gpu: a30}}\n")


def test_link_counters_lower_a_score_then_move_a_replica(tmp_path: Path) -> None:
    spec = tmp_path / "cluster.yaml"
    _pairs_spec(spec, "")
    backend, now = engine_backend(source=spec), [0.0]  # discovery reads link counters the test changes
    core = ControllerCore(controller_spec(tmp_path, counters_interval_s=30), backend, clock=lambda: now[0])
    try:
        core.deploy()
        victim = next(rid for rid, r in core.running.items() if (r.placement.node, r.placement.gpus) == ("a", (0, 1)))
        version = core.table.version
        _pairs_spec(spec, ", degraded_links: [{gpus: [0, 1], replay_per_min: 2}]")  # a few replays: score 0.83
        core.check()
        assert core.table.version == version  # not read yet: counters are read every 30 s
        now[0] = 31.0
        row = next(r for r in core.check().replicas if r.replica_id == victim)
        assert core.table.version == version + 1 and 0.5 < row.health_score < 1 and not row.draining
        assert core.running[victim].placement.node == "a"  # still healthy enough: it stays
        _pairs_spec(spec, ", degraded_links: [{gpus: [0, 1], lanes_active: 1}]")  # 1 of 4 lanes: unhealthy
        now[0] = 62.0
        core.check()
        core.settle(timeout_s=30)
        assert core.running[victim].placement.node == "b"  # re-placed off the bad link
        assert any(e["kind"] == "topology" and e["reason"] == "link counters changed" for e in events(tmp_path))
    finally:
        core.shutdown()
        backend.stop_all()
