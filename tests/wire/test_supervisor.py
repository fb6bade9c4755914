"""wire.supervisor with real child processes (`python -c ...`): ready on a line, a URL or a probe;
an early exit and a slow start fail with the child's last lines; a child that ignores SIGTERM is
killed after its grace, with what it started; output never blocks the child; and a child does
not outlive a starter that is killed outright."""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.support.wait import wait_until
from wire.processes import (
    ChildExited,
    ChildNotReady,
    Group,
    Output,
    ReadyLine,
    ReadyProbe,
    ReadyUrl,
    Stop,
    session_pids,
)
from wire.supervisor import Child

pytestmark = pytest.mark.integration
PY = sys.executable


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _gone(pid: int, timeout_s: float = 10.0) -> None:
    wait_until(lambda: not _alive(pid), timeout_s, f"process {pid} gone")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def started() -> Iterator[list[Child]]:
    """Children a test starts; none is left running after it."""
    children: list[Child] = []
    yield children
    for child in children:
        child.stop(grace_s=1.0)


def _child(started: list[Child], code: str, **kw: object) -> Child:
    child = Child([PY, "-c", code], **kw)  # type: ignore[arg-type]
    started.append(child)
    return child.start()


def test_a_ready_line_is_found_and_returned(started: list[Child]) -> None:
    code = ("import time\nfor i in range(5): print(f'warming {i}', flush=True)\n"
            "print('listening ready: http://x:1/v1', flush=True)\ntime.sleep(60)")
    child = _child(started, code, name="liner", ready=ReadyLine("ready:"))
    assert child.wait_ready(10) == "listening ready: http://x:1/v1"
    assert child.tail()[:2] == ["warming 0", "warming 1"] and child.running()
    again = _child(started, code, ready=ReadyLine(re.compile(r"ready: (\S+)$")))
    assert again.wait_ready(10).endswith("http://x:1/v1")
    assert child.stop() == -signal.SIGTERM and not child.running()


def test_a_health_url_or_a_probe_makes_it_ready(started: list[Child]) -> None:
    port = _free_port()
    server = (f"import http.server, time\ntime.sleep(0.5)\nclass H(http.server.BaseHTTPRequestHandler):\n"
              f"    def do_GET(self):\n        self.send_response(200 if self.path == '/health' else 404)\n"
              f"        self.end_headers()\n    def log_message(self, *a): pass\n"
              f"http.server.HTTPServer(('127.0.0.1', {port}), H).serve_forever()")
    url = f"http://127.0.0.1:{port}/health"
    child = _child(started, server, ready=ReadyUrl(url))
    assert child.wait_ready(10, poll_s=0.1) == url
    calls: list[int] = []

    def third_time() -> bool:
        calls.append(1)
        return len(calls) >= 3

    probed = _child(started, "import time; time.sleep(60)", ready=ReadyProbe(third_time))
    assert probed.wait_ready(10, poll_s=0.05) == "" and len(calls) == 3


def test_an_early_exit_says_so_with_the_last_lines(started: list[Child], tmp_path: Path) -> None:
    code = "import sys\nfor i in range(60): print(f'line {i}')\nprint('Fatal: no device', file=sys.stderr)\nsys.exit(3)"
    child = _child(started, code, name="dier", ready=ReadyLine("ready"), stderr=Output.STDOUT,
                   log_path=tmp_path / "dier.log")
    with pytest.raises(ChildExited) as err:
        child.wait_ready(10)
    text = str(err.value)
    assert err.value.exit_code == 3 and text.startswith("dier: exited with code 3")
    assert len(err.value.tail) == 40 and text.rstrip().endswith("| Fatal: no device") and "line 19\n" not in text
    assert "line 0\n" in (tmp_path / "dier.log").read_text()  # the log file has every line


def test_a_stderr_file_the_child_writes_is_in_the_tail(started: list[Child], tmp_path: Path) -> None:
    log = tmp_path / "err.log"
    child = _child(started, "import sys; print('bad config', file=sys.stderr); sys.exit(2)", ready=ReadyLine("ready"),
                   stderr=log)
    with pytest.raises(ChildExited, match=r"\| bad config"):
        child.wait_ready(10)


def test_not_ready_in_time_stops_it_and_what_it_started(started: list[Child], tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild"
    code = (f"import subprocess, sys, time\np = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])"
            f"\nopen({str(pid_file)!r}, 'w').write(str(p.pid))\nprint('still loading', flush=True)\ntime.sleep(60)")
    child = _child(started, code, name="slow", ready=ReadyLine("ready"), group=Group.SESSION,
                   stop=Stop(to_group=True, grace_s=2.0))
    with pytest.raises(ChildNotReady, match=r"^slow: not ready within 1 s \(it was stopped\)") as err:
        child.wait_ready(1.0)
    assert err.value.tail == ["still loading"] and not child.running()
    _gone(int(pid_file.read_text()), 2.0)
    assert session_pids(child.pid) == []


def test_sigterm_ignored_is_killed_after_the_grace(started: list[Child]) -> None:
    code = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ready', flush=True)\ntime.sleep(60)")
    child = _child(started, code, ready=ReadyLine("ready"), group=Group.OWN)
    child.wait_ready(10)
    t0 = time.monotonic()
    assert child.stop(grace_s=0.5) == -signal.SIGKILL
    assert 0.5 <= time.monotonic() - t0 < 5.0


def test_a_chatty_child_never_blocks_on_its_pipes(started: list[Child]) -> None:
    code = ("import sys\nfor i in range(100000): sys.stderr.write('noise ' * 8 + '\\n')\n"
            "print('ready', flush=True)\nimport time; time.sleep(60)")
    child = _child(started, code, ready=ReadyLine("ready"))
    assert child.wait_ready(30) == "ready"  # 5 MB on stderr before the line: an undrained pipe would hang it
    assert child.running() and child.stop() == -signal.SIGTERM


def test_a_cancelled_wait_leaves_it_running_and_the_async_wait(started: list[Child]) -> None:
    child = _child(started, "import time; time.sleep(60)", ready=ReadyLine("ready"))
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    with pytest.raises(ChildNotReady, match="cancelled"):
        child.wait_ready(30, poll_s=0.05, cancel=cancel)
    assert child.running()
    later = _child(started, "import time; time.sleep(0.3); print('ready', flush=True); time.sleep(60)",
                   ready=ReadyLine("ready"))
    assert asyncio.run(later.wait_ready_async(10)) == "ready"


STARTER = f"""
import sys, time
sys.path.insert(0, {str(ROOT)!r})
from wire.supervisor import Child, ReadyLine
child = Child([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"], ready=ReadyLine("up"))
child.start().wait_ready(20)
print(child.pid, flush=True)
time.sleep(600)
"""


def test_a_child_does_not_outlive_a_starter_killed_outright(started: list[Child]) -> None:
    starter = _child(started, STARTER, ready=ReadyLine(re.compile(r"^\d+$")), cwd=ROOT)
    grandchild = int(starter.wait_ready(30))
    assert _alive(grandchild)
    starter.kill()  # SIGKILL: no stop(), no cleanup
    starter.wait(10)
    _gone(grandchild)  # the child does not outlive the process that started it
