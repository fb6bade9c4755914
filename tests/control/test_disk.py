"""The controller with real engine processes and no Ray when its disk fills: it goes on serving
and restarting engines from memory, says "degraded" (its status, the table's plan view the
routers' /health reads, an event once the log can be written), survives a crash and restart
on the full disk (it resumes from the last good state.json), and once space is back saves again
and restarts a killed engine as before. And a link planted at state.json.tmp or events.jsonl is
never written through."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from control.controller import ControllerCore
from control.replicas.sim import ReplicaProcess
from control.spec import ControllerSpec
from router.routes import health_body
from tests.control.conftest import FakeBackend, controller_spec, health_status, mixed_pool
from tests.support.diskfakes import FullDisk

pytestmark = pytest.mark.integration


Engines = FakeBackend[ReplicaProcess]


def _spec(state_dir: Path) -> ControllerSpec:
    return controller_spec(state_dir, mixed_pool(slo_classes=()))


def _kill_and_restart(core: ControllerCore, rid: str) -> str:
    """Kill the engine of `rid`; the next pass restarts it: its new URL (it answers)."""
    victim = core.running[rid].replica
    assert isinstance(victim, ReplicaProcess) and victim.proc is not None
    old = core.running[rid].url
    victim.proc.kill()
    victim.proc.wait(5)
    core.check()
    assert core.status()["starting"] == {rid: "restart"}
    table = core.settle(timeout_s=30)
    url = next(r.url for r in table.replicas if r.replica_id == rid)
    assert url != old and health_status(url) == 200
    return url


def _saved_version(state_dir: Path) -> int:
    return int(json.loads((state_dir / "state.json").read_text())["table_version"])


def _router_health(core: ControllerCore) -> dict[str, object]:
    """What a router following this controller answers on /health (its plan view carries the health)."""
    assert core.plan is not None
    doc: dict[str, object] = json.loads(health_body(len(core.table.replicas),
                                                    {**core.plan.to_json(), "controller": core.status()}))
    return doc


def test_disk_full_then_freed_leaves_a_working_controller(tmp_path: Path, engines: Engines) -> None:
    state_dir = tmp_path / "state"
    disk = FullDisk(state_dir)
    first = ControllerCore(_spec(state_dir), engines, files=disk)
    first.deploy()
    assert first.status()["health"]["status"] == "ok" and _router_health(first) == {"status": "ok", "replicas": 2}
    good = _saved_version(state_dir)

    disk.full = True  # serving and restarting go on from memory; the state on disk stays the last good one
    version = first.table.version
    _kill_and_restart(first, "mixed-0")
    health = first.status()["health"]
    assert health["status"] == "degraded" and [a["kind"] for a in health["alerts"]] == ["event_log", "state_save"]
    assert "No space left on device" in health["reasons"][1]
    assert first.table.version > version + 1  # the health changed: a version of its own, routers follow it
    assert _router_health(first)["status"] == "degraded" and _saved_version(state_dir) == good
    assert not (state_dir / "state.json.tmp").exists()

    # the controller crashes; its restart finds the disk still full: it resumes from the last good
    # state (the replicas are found again by name), serves, and restarts engines
    last = first.table
    second = ControllerCore(_spec(state_dir), engines, files=disk)
    second.deploy()
    assert second.table.version <= last.version and second.table.supersedes(last)  # routers take it anyway
    assert set(second.running) == {"mixed-0", "mixed-1"}
    assert second.status()["health"]["status"] == "degraded"
    second.settle(timeout_s=30)  # mixed-0 restarted after the last good save: reattached by name or started
    assert all(health_status(r.url) == 200 for r in second.table.replicas)
    _kill_and_restart(second, "mixed-1")
    assert second.keeper.retry_due and _saved_version(state_dir) == good

    disk.full = False  # space is back: the next pass saves, the health clears, the routers see it
    table = second.check()
    assert second.status()["health"]["status"] == "ok" and _router_health(second)["status"] == "ok"
    assert _saved_version(state_dir) == table.version
    assert second.status()["health"]["write_failures"]["state_save"] >= 2
    _kill_and_restart(second, "mixed-0")  # and a killed engine is restarted as before
    assert _saved_version(state_dir) == second.table.version
    kinds = [json.loads(line)["kind"] for line in (state_dir / "events.jsonl").read_text().splitlines()]
    assert "state_save_recovered" in kinds and kinds.count("restart") >= 1
    second.shutdown()


def test_links_planted_in_the_state_dir_are_not_written_through(tmp_path: Path, engines: Engines) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (state_dir / "state.json.tmp").symlink_to(victim)
    (state_dir / "events.jsonl").symlink_to(victim)
    core = ControllerCore(_spec(state_dir), engines)
    try:
        core.deploy()
        assert victim.read_text() == "precious\n"
        saved = state_dir / "state.json"
        assert not saved.is_symlink() and json.loads(saved.read_text())["table_version"] == core.table.version
        assert (state_dir / "events.jsonl").is_symlink()  # refused, left as it is
        health = core.status()["health"]
        assert health["status"] == "degraded" and [a["kind"] for a in health["alerts"]] == ["event_log"]
    finally:
        core.shutdown()
    assert victim.read_text() == "precious\n"
