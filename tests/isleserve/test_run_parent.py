"""`isle run --stop-with-parent` (what `make run` runs): when the process that started it ends
(GNU make, stopped by SIGTERM, exits without passing the signal on), it stops as on SIGTERM:
its own Ray head and everything under it go, and it says so."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from wire.processes import session_pids

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STARTER = """
import subprocess, sys, time
log = open(sys.argv[2], "w")
child = subprocess.Popen([sys.argv[1], "run", "--stop-with-parent", "configs/local.yaml"], stdout=log, stderr=log,
                         start_new_session=True)
print(child.pid, flush=True)
deadline = time.monotonic() + 60
while time.monotonic() < deadline and "ray head" not in open(sys.argv[2]).read() and child.poll() is None:
    time.sleep(0.2)
"""


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_isle_run_stops_when_its_starter_ends(tmp_path: Path) -> None:
    log = tmp_path / "isle.log"
    isle = str(Path(sys.executable).parent / "isle")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    # the starter ends without a signal to its child once the child's Ray head is starting
    starter = subprocess.run([sys.executable, "-c", STARTER, isle, str(log)], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=90, check=True)
    pid = int(starter.stdout.split()[0])
    deadline = time.monotonic() + 30
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [p for p in session_pids(pid) if not _gone(p)]
    assert _gone(pid) and not left, (left, log.read_text()[-2000:])
    text = log.read_text()
    assert "isleserve: stopping" in text and "Traceback" not in text, text[-2000:]
