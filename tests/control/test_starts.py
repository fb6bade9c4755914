"""Starts beside the health loop, over fake replicas whose start the test holds (an engine that
takes 60 s to load, without waiting 60 s): a killed replica is restarted and published within a
couple of passes while another one is still starting, mark_link and node loss go on meanwhile, a
start that a newer decision replaced is never installed (and what it started is stopped), and
shutdown stops what is being started. Then the node check's wording and log level."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from control import nodecheck
from control.controller import ControllerCore
from control.nodecheck import RayNode
from control.spec import ControllerSpec
from tests.control.conftest import PAIRS, SLOW_START_S, FakeBackend, FakeReplica, HeldStarts, controller_spec, events
from topology import read_source

pytestmark = pytest.mark.unit
Held = FakeBackend[FakeReplica]
Deployed = tuple[ControllerCore, Held, HeldStarts, str, str]


def held_backend(starts: HeldStarts) -> Held:
    """Replicas whose start the test holds; nodes a and b bound to Ray nodes the test can take away."""
    return FakeBackend(starts, nodes=("a", "b"), attachable=lambda _: False)


def _spec(tmp_path: Path) -> ControllerSpec:
    return controller_spec(tmp_path, time_scale=1.0)


def _quick(call: Callable[[], Any]) -> Any:
    """`call`'s result; it must not have waited for a held start."""
    began = time.monotonic()
    out = call()
    assert time.monotonic() - began < SLOW_START_S / 2, "waited for a start in flight"
    return out


def _passes(core: ControllerCore, done: Callable[[], bool], most: int = 4) -> int:
    """Health passes (the loop's wait between them: until a start ends) until `done`; how many."""
    for n in range(1, most + 1):
        core.check()
        if done():
            return n
        core.fleet.starts.finished.wait(5)
    return 0


@pytest.fixture
def deployed(tmp_path: Path) -> Iterator[Deployed]:
    """Both replicas on node a: (core, backend, its starts, the one on a:0,1, the one on a:2,3)."""
    starts = HeldStarts()
    backend = held_backend(starts)
    core = ControllerCore(_spec(tmp_path), backend)
    core.deploy()
    by_gpus = {r.placement.gpus: rid for rid, r in core.running.items() if r.placement.node == "a"}
    try:
        yield core, backend, starts, by_gpus[(0, 1)], by_gpus[(2, 3)]
    finally:
        starts.release_all()
        core.shutdown()


def _kill(core: ControllerCore, rid: str) -> FakeReplica:
    replica = core.running[rid].replica
    assert isinstance(replica, FakeReplica)
    replica.alive, replica.actor_dead = False, True
    return replica


def test_a_killed_replica_restarts_while_a_slow_one_is_still_starting(
        deployed: Deployed, tmp_path: Path) -> None:
    core, _, starts, slow, other = deployed
    held = starts.hold(slow, 1)
    moves = _quick(lambda: core.mark_link("a", 0, 1, reason="test"))  # the replacement takes "60 s" to load
    assert [(m["replica_id"], m["order"]) for m in moves] == [(slow, "make-before-break")]
    assert core.status()["starting"] == {slow: "move"} and core.running[slow].draining
    _kill(core, other)
    version = core.table.version
    assert _passes(core, lambda: core.running[other].launch.generation == 1) in (1, 2)
    row = next(r for r in core.table.replicas if r.replica_id == other)
    assert row.url == core.running[other].url == f"http://fake/isleserve-{other}-g1" and core.table.version > version
    assert [e["result"] for e in events(tmp_path, "restart") if e["replica_id"] == other] == ["new actor"]
    assert core.status()["starting"] == {slow: "move"} and core.running[slow].launch.generation == 0
    held.set()  # the slow one is up: installed, and its predecessor drains off
    core.settle(timeout_s=5)
    assert core.running[slow].placement.node == "b" and core.status()["starting"] == {}
    assert [r.placement.replica_id for r in core.retiring] == [slow]
    assert [e["result"] for e in events(tmp_path, "move")] == ["replacement serving"]
    assert {r.replica_id: r.node for r in core.table.replicas}[slow] == "b"


def test_mark_link_returns_while_a_restart_is_in_flight(deployed: Deployed,
                                                        tmp_path: Path) -> None:
    core, _, starts, moved, slow = deployed
    held = starts.hold(slow, 1)
    _kill(core, slow)
    _quick(core.check)
    assert core.status()["starting"] == {slow: "restart"}
    moves = _quick(lambda: core.mark_link("a", 0, 1, reason="test"))
    assert [m["replica_id"] for m in moves] == [moved]
    assert _passes(core, lambda: core.running[moved].placement.node == "b") in (1, 2)
    assert core.status()["starting"] == {slow: "restart"}
    held.set()
    core.settle(timeout_s=5)
    assert core.running[slow].launch.generation == 1 and core.running[slow].replica.healthy()
    assert {e["generation"] for e in events(tmp_path, "replica_started") if e["replica_id"] == slow} == {0, 1}


def test_a_start_replaced_by_a_newer_decision_is_stopped_not_installed(
        deployed: Deployed, tmp_path: Path) -> None:
    core, backend, starts, victim, _ = deployed
    held = starts.hold(victim, 1)
    old = core.running[victim]
    core.mark_link("a", 0, 1, reason="test")  # its replacement starts on b ...
    backend.alive["b"] = False  # ... and node b leaves meanwhile: no room left, it keeps running drained
    _quick(core.check)
    assert core.lost == {"b"} and core.status()["starting"] == {}
    assert events(tmp_path, "start_dropped")[0]["replica_id"] == victim
    assert events(tmp_path, "move")[-1]["result"] == "no room: kept running, drained"
    late = backend.by_name[f"isleserve-{victim}-g1"]
    held.set()  # its start still ends, late: stopped, never installed
    core.settle(timeout_s=5)
    assert late.stopped.wait(5) and not late.alive
    assert core.running[victim] is old and old.draining and not core.retiring
    assert not [e for e in events(tmp_path, "replica_started") if e["generation"] == 1]


def test_shutdown_stops_what_is_being_started(deployed: Deployed,
                                              tmp_path: Path) -> None:
    core, backend, starts, victim, _ = deployed
    starts.interruptible = True
    starts.hold(victim, 1)
    core.mark_link("a", 0, 1, reason="test")
    starting = backend.by_name[f"isleserve-{victim}-g1"]
    _quick(core.shutdown)  # the start ends once its replica is stopped
    assert starting.stopped.is_set() and not starting.alive and not core.running
    assert not [r for r in backend.by_name.values() if r.alive]
    assert [e["reason"] for e in events(tmp_path, "start_dropped")] == ["shutdown"]
    assert not [e for e in events(tmp_path, "replica_started") if e["generation"] == 1]


def test_simulated_nodes_without_a_ray_node_are_noted_at_info(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    backend = held_backend(HeldStarts())
    backend.alive = {}  # as on the simulated default (one local Ray): no Ray node carries a declared node
    core = ControllerCore(_spec(tmp_path), backend)
    with caplog.at_level(logging.INFO, logger="isleserve.controller"):
        core.deploy()
    core.shutdown()
    notes = [r for r in caplog.records if r.getMessage().startswith("node check:")]
    assert [(r.levelno, r.getMessage()) for r in notes] == [
        (logging.INFO, f"node check: simulated node {n} has no Ray node (simulated nodes have none unless a Ray "
                       f"node was started with their labels); its replicas run unpinned on any Ray node")
        for n in ("a", "b")]


def test_real_node_check_problems_stay_warnings() -> None:
    topology = read_source(PAIRS)
    wrong = RayNode(node_id="ray-a", labels={nodecheck.NODE_LABEL: "a"})
    for simulated, report in ((False, nodecheck.check(topology, {}, simulated=False)),
                              (True, nodecheck.check(topology, {"a": wrong}, simulated=True))):
        levels = dict((line.split(":")[0], level) for level, line in report.lines())
        assert report.unpinned == (() if not simulated else ("b",))
        assert levels.get("a") == logging.WARNING, report.lines()
