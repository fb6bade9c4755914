"""The controller's state directory and its files: private (0700, ours, nobody else may write),
per user by default, no write through a planted link; a failed save (a full disk) keeps the last
good state.json, opens an alert, and closes it when a later save succeeds."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from control.replicas.liveness import answers_within
from control.state import saved as state
from control.state.alarms import Alarms
from control.state.events import EventLog
from control.state.files import DiskFiles, StateDirError, default_state_dir, private_dir
from control.state.marks import LinkMark
from control.state.persist import StateKeeper
from pools.model import PlacementRequest, PoolSpec
from pools.placement import get_policy
from tests.conftest import ROOT
from tests.support.diskfakes import FullDisk
from topology import read_source

pytestmark = pytest.mark.unit
POOL = PoolSpec(name="m", role="mixed", tp=2, replicas=2, model="llama-3.1-8b")


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_the_default_is_per_user_never_a_shared_tmp_path(tmp_path: Path) -> None:
    assert default_state_dir({}, "/home/u") == "/home/u/.local/state/isleserve"
    assert default_state_dir({"XDG_STATE_HOME": "/s"}, "/home/u") == "/s/isleserve"
    assert default_state_dir({"XDG_STATE_HOME": "relative"}, "/home/u") == "/home/u/.local/state/isleserve"
    runtime = tmp_path / "run"  # removed at logout and reboot, with what a restarted controller needs: not used
    assert default_state_dir({"XDG_RUNTIME_DIR": str(runtime)}, "/home/u") == "/home/u/.local/state/isleserve"
    assert not default_state_dir().startswith("/tmp/")


def test_the_app_config_and_the_spec_default_to_it() -> None:
    from control.spec import ControllerSpec
    from isleserve.settings import app_args_from_serve_config

    args = app_args_from_serve_config(str(ROOT / "configs/local.yaml"))
    assert args.state_dir == default_state_dir() and "/tmp/isleserve" not in args.state_dir
    spec = ControllerSpec(topology_source="x", engine="sim", policy="island-aligned", pools=(POOL,))
    assert spec.state_dir == default_state_dir()


def test_a_new_directory_is_made_private(tmp_path: Path) -> None:
    made = private_dir(tmp_path / "a" / "b" / "isleserve")
    assert made.is_dir() and _mode(made) == 0o700 and _mode(made.parent) == 0o700


def test_an_unsafe_directory_is_refused(tmp_path: Path) -> None:
    open_dir = tmp_path / "shared"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    with pytest.raises(StateDirError, match=r"writable by its group or by everyone \(mode 0777\)"):
        private_dir(open_dir)
    with pytest.raises(StateDirError, match="writable by its group"):
        DiskFiles(open_dir)
    not_dir = tmp_path / "file"
    not_dir.write_text("x")
    with pytest.raises(StateDirError, match="not a directory"):
        private_dir(not_dir)


@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory another user's needs root")
def test_a_directory_or_link_of_another_user_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(StateDirError, match="owned by uid 65534, not by this user"):
        private_dir(theirs)
    mine = private_dir(tmp_path / "mine")
    link = tmp_path / "planted"
    link.symlink_to(mine)
    os.lchown(link, 65534, 65534)
    with pytest.raises(StateDirError, match="symbolic link owned by uid 65534"):
        private_dir(link)


def test_a_state_dir_under_a_directory_another_user_controls_is_refused(tmp_path: Path) -> None:
    """The state dir's own checks held, but one further up was another user's (found by an
    adversary: they moved our `state/` aside and the controller wrote into theirs): every
    directory above it, on the path as given and as resolved, must be ours or root's, and not
    writable by others unless sticky (as /tmp)."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chmod(theirs, 0o777)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(StateDirError, match="directory owned by uid 65534"):
        private_dir(theirs / "x" / "state")
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)  # ours, but anyone may rename what is in it
    with pytest.raises(StateDirError, match="writable by others without the sticky bit"):
        private_dir(open_dir / "state")
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)  # as /tmp: others cannot move what is ours
    assert private_dir(sticky / "state").is_dir()
    target = private_dir(tmp_path / "mine")
    link = tmp_path / "via"
    link.symlink_to(target.parent)
    os.lchown(link, 65534, 65534)  # a link of theirs on the way: they may point it elsewhere later
    with pytest.raises(StateDirError, match="symbolic link owned by uid 65534"):
        private_dir(link / "mine")


def test_writes_never_follow_a_planted_link(tmp_path: Path) -> None:
    files = DiskFiles(tmp_path / "state")
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (files.directory / "state.json.tmp").symlink_to(victim)
    (files.directory / "events.jsonl").symlink_to(victim)
    files.replace("state.json", b"{}")  # the link at the tmp name goes; a file of ours takes its place
    assert (files.directory / "state.json").read_bytes() == b"{}" and not (files.directory / "state.json.tmp").exists()
    assert _mode(files.directory / "state.json") == 0o600 and not (files.directory / "state.json").is_symlink()
    with pytest.raises(OSError):  # ELOOP: not through it
        files.append("events.jsonl", b"line\n")
    assert victim.read_text() == "precious\n"
    assert files.read("events.jsonl") is None  # not read through one either
    files.append("new.jsonl", b"a\n")
    assert _mode(files.directory / "new.jsonl") == 0o600
    with pytest.raises(ValueError, match="inside the state directory"):
        files.replace("../escape", b"x")



def test_a_removed_directory_is_made_again(tmp_path: Path) -> None:
    files = DiskFiles(tmp_path / "state")
    files.append("events.jsonl", b"a\n")
    (files.directory / "events.jsonl").unlink()
    files.directory.rmdir()
    files.append("events.jsonl", b"b\n")
    files.replace("state.json", b"{}")
    assert files.read("events.jsonl") == b"b\n" and _mode(files.directory) == 0o700


def _state(version: int) -> state.ControllerState:
    topology = read_source(str(ROOT / "tests/data/pairs-cluster.yaml"))
    plan = get_policy("island-aligned").place(PlacementRequest(topology=topology, pools=(POOL,)))
    return state.ControllerState(session="s", spec_digest="d", plan=plan, table_version=version,
                                 marks=(LinkMark(node="a", a=0, b=1, reason="r"),))


def test_a_full_disk_keeps_the_last_good_state_and_the_save_recovers(tmp_path: Path) -> None:
    disk = FullDisk(tmp_path / "state")
    alarms = Alarms(clock=lambda: 100.0)
    recorded: list[tuple[str, dict[str, Any]]] = []
    keeper = StateKeeper(disk, alarms, lambda kind, payload: recorded.append((kind, payload)))
    assert not keeper.save(_state(3)) and not keeper.retry_due
    disk.full = True
    assert keeper.save(_state(4))  # the alert opens: the health changed
    assert not keeper.save(_state(5)) and keeper.retry_due  # still open: no change, counted
    loaded = state.load(disk, (POOL,), {})
    assert loaded is not None and loaded.table_version == 3  # the last good one, whole
    assert not (disk.directory / "state.json.tmp").exists()
    health = alarms.health()
    assert health["status"] == "degraded" and health["write_failures"]["state_save"] == 2
    assert health["reasons"] == [f"saving the controller state (state.json) fails: No space left on device "
                                 f"({disk.directory / 'state.json'})"]
    assert [k for k, _ in recorded] == ["state_save_failed"]
    disk.full = False
    assert keeper.save(_state(6)) and not keeper.retry_due and alarms.health()["status"] == "ok"
    assert recorded[-1] == ("state_save_recovered", {"failures": 2, "since_s": 100.0, "table_version": 6})
    loaded = state.load(disk, (POOL,), {})
    assert loaded is not None and loaded.table_version == 6


def test_a_lost_event_line_opens_an_alert_and_never_raises(tmp_path: Path) -> None:
    disk = FullDisk(tmp_path / "state")
    alarms = Alarms()
    log = EventLog(disk, alarms, clock=lambda: 1.0)
    log.record("a", "f", {})
    disk.full = True
    log.record("b", "f", {"x": 1})
    assert alarms.health()["status"] == "degraded" and alarms.signature()[0][0] == "event_log"
    disk.full = False
    log.record("c", "f", {})
    assert alarms.health()["status"] == "ok" and alarms.health()["write_failures"]["event_log"] == 1
    lines = [json.loads(x) for x in (disk.directory / "events.jsonl").read_text().splitlines()]
    assert [x["kind"] for x in lines] == ["a", "c"]


def test_liveness_waits_for_one_answer_within_the_window() -> None:
    now = [0.0]

    def clock() -> float:
        return now[0]

    def sleep(s: float) -> None:
        now[0] += s

    def hung(timeout_s: float) -> bool:
        now[0] += timeout_s  # a stopped engine: every probe runs to its timeout
        return False

    assert not answers_within(hung, 4.0, clock=clock, sleep=sleep) and now[0] == pytest.approx(4.0)
    answers = iter([False, False, True])
    now[0] = 0.0
    assert answers_within(lambda t: next(answers), 4.0, clock=clock, sleep=sleep)  # refused twice, then up
    assert now[0] == pytest.approx(0.4)
