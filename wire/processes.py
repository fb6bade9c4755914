"""What a supervised child (wire.supervisor) is made of, and the process table it reads: where
its output goes (`Output`), its process group (`Group`), how to tell it is ready (`ReadyLine`,
`ReadyUrl`, `ReadyProbe`), how to stop it (`Stop`), the errors it raises, and the live
processes of a session (`session_pids`, from /proc). No process is started here."""

from __future__ import annotations

import enum
import os
import re
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from wire.lifecycle import follow_parent


class Output(enum.Enum):
    """Where a stream of the child goes (a `Path`: the child writes that file itself)."""

    CAPTURE = "capture"
    """A pipe, drained into the tail (and the log file)."""
    DEVNULL = "devnull"
    INHERIT = "inherit"
    STDOUT = "stdout"
    """stderr only: merged into stdout."""


class Group(enum.Enum):
    SAME = "same"
    """Ours: signals reach the child alone."""
    OWN = "own"
    """A process group of its own (a terminal's Ctrl-C is not sent to it)."""
    SESSION = "session"
    """A session of its own: everything it starts is found by session id, even in other groups."""


@dataclass(frozen=True, slots=True)
class ReadyLine:
    match: str | re.Pattern[str] | Callable[[str], bool]
    """A substring, a compiled regex (searched), or a predicate."""

    def matches(self, line: str) -> bool:
        if isinstance(self.match, str):
            return self.match in line
        if isinstance(self.match, re.Pattern):
            return self.match.search(line) is not None
        return bool(self.match(line))


@dataclass(frozen=True, slots=True)
class ReadyUrl:
    url: str
    timeout_s: float = 2.0
    """For each GET."""


@dataclass(frozen=True, slots=True)
class ReadyProbe:
    check: Callable[[], bool]


Ready = ReadyLine | ReadyUrl | ReadyProbe


@dataclass(frozen=True, slots=True, kw_only=True)
class Stop:
    signal: int = signal.SIGTERM
    to_group: bool = False
    """The signal to everything in the child's group or session, not to the child alone."""
    grace_s: float = 10.0
    """For the child to exit after the signal."""
    linger_s: float | None = 0.0
    """A child with a group of its own: how long what it started has to exit after it before
    SIGKILL. None: once the child itself exited within its grace, leave the rest alone."""


class ChildError(RuntimeError):
    """The child did not come up; the message ends with its last log lines."""

    def __init__(self, name: str, reason: str, tail: list[str], exit_code: int | None, elapsed_s: float) -> None:
        super().__init__(f"{name}: {reason}; {tail_block(tail)}")
        self.name, self.reason, self.tail, self.exit_code, self.elapsed_s = name, reason, tail, exit_code, elapsed_s


class ChildExited(ChildError):
    pass


class ChildNotReady(ChildError):
    pass


def tail_block(tail: list[str]) -> str:
    shown = "\n".join(f"  | {line}" for line in tail) if tail else "  (it printed nothing)"
    return f"its last {len(tail)} log lines:\n{shown}"


def url_answers(url: str, timeout_s: float = 2.0) -> bool:
    """A GET of `url` answers 2xx within `timeout_s` (the child's own address: any host)."""
    from wire import client  # httpx: only for the processes that poll a URL

    try:
        return client.get(url, timeout_s=timeout_s, remote_ok=True).ok
    except (client.Unreachable, client.TimedOut):
        return False


def _stat(pid_dir: Path) -> tuple[str, int, int] | None:
    """(state, process group, session) of /proc/PID, None when it is gone."""
    try:
        fields = (pid_dir / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[2]), int(fields[3])


def live_pids(wanted: Callable[[int, int], bool]) -> list[int]:
    out = []
    for pid_dir in Path("/proc").glob("[0-9]*"):
        stat = _stat(pid_dir)
        if stat is not None and stat[0] not in ("Z", "X") and wanted(stat[1], stat[2]):
            out.append(int(pid_dir.name))
    return out


def session_pids(sid: int) -> list[int]:
    """Live processes of session `sid` (zombies left out)."""
    return live_pids(lambda _group, session: session == sid)


def follow_starter(starter: int, sig: int) -> None:
    """Between fork and exec: `sig` when the starting thread ends; exit at once when the starter
    died before we asked. Only system calls: safe in a forked child."""
    if follow_parent(sig) and os.getppid() != starter:
        os._exit(1)


def output_target(out: Output | Path) -> int | IO[bytes] | None:
    if isinstance(out, Path):
        return out.open("wb")
    return {Output.CAPTURE: subprocess.PIPE, Output.DEVNULL: subprocess.DEVNULL, Output.INHERIT: None,
            Output.STDOUT: subprocess.STDOUT}[out]


def file_tail(path: Path, lines: int) -> list[str]:
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 65536))
            return f.read().decode("utf-8", "replace").splitlines()[-lines:]
    except OSError:
        return []
