"""One child process, supervised: started (argv, environment, directory; optionally in a process
group or a session of its own), waited on until it is ready, and stopped. Every process this
project starts (engines, vLLM servers, router workers, Ray nodes, bench servers) goes through it.

Ready is one of, given when the child is made:

- `ReadyLine(match)`: a line on its stdout (and stderr, merged into it) holds a substring,
  matches a regex, or satisfies a predicate; `wait_ready` returns that line;
- `ReadyUrl(url)`: a GET of the URL answers 2xx;
- `ReadyProbe(check)`: a check of the caller's answers True (a port that takes connections, a
  health function of its own).

Captured output is drained on threads from the start, so a chatty child never blocks on a full
pipe; the last `tail_lines` lines are kept (each line may also go to a log file and a callback)
and both errors carry them:

    ChildError (RuntimeError)  name, reason, tail, exit_code, elapsed_s; ends with the tail
      ChildExited              it exited before it was ready
      ChildNotReady            not ready within the timeout (stopped), or the wait was cancelled

Stopping (`Stop`): one signal (SIGTERM unless told) to the child, or to everything in its group
or session; `grace_s` for the child to exit; then, for a child with a group of its own,
`linger_s` for what it started; then SIGKILL to whatever is left.

The parent's death: by default the child gets SIGTERM when the *thread* that started it ends
(Linux PR_SET_PDEATHSIG, set between fork and exec, kept across exec), so it never outlives a
starter killed outright. A starter on a short-lived thread (a pool's) passes `parent_death=None`
and leaves the watching to the child.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, NoReturn

from wire.processes import (
    ChildError,
    ChildExited,
    ChildNotReady,
    Group,
    Output,
    Ready,
    ReadyLine,
    ReadyUrl,
    Stop,
    file_tail,
    follow_starter,
    live_pids,
    output_target,
    url_answers,
)

__all__ = ["Child"]

log = logging.getLogger("isleserve.supervisor")
TAIL_LINES = 40
DRAIN_JOIN_S = 5.0
"""How long a stop waits for the last lines of an exited child to be read."""


class Child:
    """One supervised process; `start()` it, `wait_ready()`, `stop()`. Also `pid`, `poll()`,
    `wait()`, `kill()`, `send_signal()` as on `subprocess.Popen`."""

    def __init__(self, argv: Sequence[str], *, name: str | None = None, ready: Ready | None = None,
                 env: Mapping[str, str] | None = None, cwd: str | Path | None = None, group: Group = Group.SAME,
                 stdin: Output = Output.INHERIT, stdout: Output | Path = Output.CAPTURE,
                 stderr: Output | Path = Output.CAPTURE, log_path: str | Path | None = None,
                 on_line: Callable[[str], None] | None = None, tail_lines: int = TAIL_LINES,
                 parent_death: int | None = signal.SIGTERM, stop: Stop | None = None) -> None:
        if isinstance(ready, ReadyLine) and stdout is not Output.CAPTURE:
            raise ValueError("a ready line is read from stdout: it must be Output.CAPTURE")
        if stdout is Output.STDOUT or stdin not in (Output.INHERIT, Output.DEVNULL):
            raise ValueError("stdout cannot be merged into itself; stdin is inherited or /dev/null")
        self.argv, self.name, self.ready = list(argv), name or Path(argv[0]).name, ready
        self.env, self.cwd, self.group = dict(env) if env is not None else None, cwd, group
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.log_path = Path(log_path) if log_path is not None else None
        self.on_line, self.parent_death, self.stop_plan = on_line, parent_death, stop if stop is not None else Stop()
        self._tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self._popen: subprocess.Popen[str] | None = None
        self._cond = threading.Condition()
        self._stop_lock = threading.Lock()
        self._drains: list[threading.Thread] = []
        self._open_streams = 0
        self._ready_line: str | None = None
        self._sink: IO[str] | None = None
        self._started_at = 0.0
        self._signalled = False

    # start
    def start(self) -> Child:
        if self._popen is not None and self._popen.poll() is None:
            raise RuntimeError(f"{self.name} is already running (pid {self._popen.pid})")
        self._tail.clear()
        self._ready_line, self._signalled = None, False
        targets = [output_target(self.stdin), output_target(self.stdout), output_target(self.stderr)]
        preexec = (functools.partial(follow_starter, os.getpid(), self.parent_death)
                   if self.parent_death is not None else None)
        try:
            self._popen = subprocess.Popen(
                self.argv, stdin=targets[0], stdout=targets[1], stderr=targets[2], env=self.env, cwd=self.cwd,
                text=True, encoding="utf-8", errors="replace", start_new_session=self.group is Group.SESSION,
                process_group=0 if self.group is Group.OWN else None, preexec_fn=preexec)  # noqa: PLW1509
        finally:
            for t in targets:
                if not isinstance(t, int) and t is not None:
                    t.close()  # the child has its own copy of a file it writes
        self._started_at = time.monotonic()
        self._start_drains(self._popen)
        return self

    def _start_drains(self, popen: subprocess.Popen[str]) -> None:
        streams = [(s, kind) for s, kind in ((popen.stdout, "stdout"), (popen.stderr, "stderr")) if s is not None]
        self._sink = self.log_path.open("a", encoding="utf-8") if streams and self.log_path is not None else None
        self._open_streams = len(streams)
        self._drains = [threading.Thread(target=self._drain, args=(s, kind == "stdout"), daemon=True,
                                         name=f"{self.name}-{kind}") for s, kind in streams]
        for t in self._drains:
            t.start()

    def _drain(self, stream: IO[str], ready_stream: bool) -> None:
        """Every line of one pipe into the tail (and the log file and the callback), to its end."""
        try:
            for raw in stream:
                line = raw.rstrip("\n")
                with self._cond:
                    self._tail.append(line)
                    if self._sink is not None:
                        self._sink.write(line + "\n")
                        self._sink.flush()
                    if (ready_stream and self._ready_line is None and isinstance(self.ready, ReadyLine)
                            and self.ready.matches(line)):
                        self._ready_line = line
                    self._cond.notify_all()
                if self.on_line is not None:
                    self.on_line(line)
        finally:
            stream.close()
            with self._cond:
                self._open_streams -= 1
                if self._open_streams == 0 and self._sink is not None:
                    self._sink.close()
                    self._sink = None
                self._cond.notify_all()

    # ready
    def wait_ready(self, timeout_s: float, *, poll_s: float = 0.5, cancel: threading.Event | None = None,
                   stop_on_failure: bool = True) -> str:
        """Until ready: the ready line (a `ReadyUrl`: the URL; a probe: ""). ChildExited when it
        exits first; ChildNotReady after `timeout_s`, or when `cancel` is set. With
        `stop_on_failure` a child that is not ready in time is stopped (an exited one too: what it
        started may still run); a cancelled wait stops nothing."""
        popen, ready = self._running(), self.ready
        if ready is None:
            raise ValueError(f"{self.name}: no ready check was given")
        deadline = time.monotonic() + timeout_s
        while True:
            found = self._ready_now(ready, popen)
            if found is not None:
                log.debug("%s ready after %.1f s", self.name, self.elapsed_s())
                return found
            if popen.poll() is not None:
                self._join_drains()
                if isinstance(ready, ReadyLine) and self._ready_line is not None:
                    continue  # its last lines held the ready line
                self._fail(ChildExited, f"exited with code {popen.returncode} {self.elapsed_s():.1f} s after start, "
                           "before it was ready", popen.returncode, stop_on_failure)
            if cancel is not None and cancel.is_set():
                self._fail(ChildNotReady, "the wait for it was cancelled", None, False)
            left = deadline - time.monotonic()
            if left <= 0:
                self._fail(ChildNotReady, f"not ready within {timeout_s:g} s"
                           + (" (it was stopped)" if stop_on_failure else ""), None, stop_on_failure)
            self._pause(min(poll_s, left), cancel)

    async def wait_ready_async(self, timeout_s: float, *, poll_s: float = 0.5, stop_on_failure: bool = True) -> str:
        """`wait_ready` on a thread; cancelling the coroutine ends that wait within `poll_s`."""
        cancel = threading.Event()
        try:
            return await asyncio.to_thread(self.wait_ready, timeout_s, poll_s=poll_s, cancel=cancel,
                                           stop_on_failure=stop_on_failure)
        finally:
            cancel.set()

    def _ready_now(self, ready: Ready, popen: subprocess.Popen[str]) -> str | None:
        """A ready line counts even when the child has exited since; a URL or probe only while it runs."""
        if isinstance(ready, ReadyLine):
            with self._cond:
                return self._ready_line
        if popen.poll() is not None:
            return None
        if isinstance(ready, ReadyUrl):
            return ready.url if url_answers(ready.url, ready.timeout_s) else None
        return "" if ready.check() else None

    def _pause(self, seconds: float, cancel: threading.Event | None) -> None:
        if isinstance(self.ready, ReadyLine):
            with self._cond:
                if self._ready_line is None and self._open_streams > 0:
                    self._cond.wait(seconds)  # a new line wakes us
                    return
        if cancel is not None:
            cancel.wait(seconds)
        else:
            time.sleep(seconds)

    def _fail(self, kind: type[ChildError], reason: str, code: int | None, stop: bool) -> NoReturn:
        if stop:
            self.stop()
        raise kind(self.name, reason, self.tail(), code, self.elapsed_s())

    # what it is doing
    def _running(self) -> subprocess.Popen[str]:
        if self._popen is None:
            raise RuntimeError(f"{self.name} was not started")
        return self._popen

    @property
    def pid(self) -> int:
        return self._running().pid

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode if self._popen is not None else None

    def poll(self) -> int | None:
        return self._running().poll()

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code (subprocess.TimeoutExpired after `timeout`)."""
        return self._running().wait(timeout)

    def running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def elapsed_s(self) -> float:
        return time.monotonic() - self._started_at

    def tail(self) -> list[str]:
        """Its last lines: what was drained, then the end of each file it writes itself."""
        with self._cond:
            lines = list(self._tail)
        for out in (self.stdout, self.stderr):
            if isinstance(out, Path):
                lines.extend(file_tail(out, self._tail.maxlen or TAIL_LINES))
        return lines[-(self._tail.maxlen or TAIL_LINES):]

    def members(self) -> list[int]:
        """Live processes of its group (and session) when it has one of its own, else []."""
        if self._popen is None or self.group is Group.SAME:
            return []
        leader, session = self._popen.pid, self.group is Group.SESSION
        return live_pids(lambda group, sid: group == leader or (session and sid == leader))

    # signals and stopping
    def send_signal(self, sig: int) -> None:
        self._running().send_signal(sig)

    def kill(self) -> None:
        """SIGKILL to the child alone, now."""
        self._running().kill()

    def terminate(self) -> None:
        """The stop signal (`Stop.signal`), once per start: to the child, or to its group and
        session (`Stop.to_group`). Safe in a signal handler."""
        popen = self._running()
        if self._signalled:
            return
        self._signalled = True
        if self.stop_plan.to_group and self.group is not Group.SAME:
            self._signal_members(self.stop_plan.signal)
        elif popen.poll() is None:
            popen.send_signal(self.stop_plan.signal)

    def _signal_members(self, sig: int) -> None:
        assert self._popen is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._popen.pid, sig)
        if self.group is Group.SESSION:
            for pid in self.members():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)

    def stop(self, grace_s: float | None = None, *, linger_s: float | None = None) -> int | None:
        """The stop signal (unless `terminate()` sent it), `grace_s` for the child to exit, then
        `linger_s` for the rest of its group or session, then SIGKILL to what is left (the child
        alone when it shares our group); its exit code (None: never started). Either defaults to
        the child's `Stop`."""
        if self._popen is None:
            return None
        popen, plan = self._popen, self.stop_plan
        grace = plan.grace_s if grace_s is None else grace_s
        linger = plan.linger_s if linger_s is None else linger_s
        with self._stop_lock:
            self.terminate()
            try:
                popen.wait(grace)
            except subprocess.TimeoutExpired:
                log.warning("%s: no exit %g s after %s, killing it", self.name, grace,
                            signal.Signals(plan.signal).name)
            exited = popen.poll() is not None
            if self.group is Group.SAME:
                if not exited:
                    popen.kill()
            elif not exited or linger is not None:
                self._wait_members(linger or 0.0)
                self._signal_members(signal.SIGKILL)
            code = popen.wait()
            self._join_drains()
            return code

    def _wait_members(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.members():
            time.sleep(0.1)

    def _join_drains(self, timeout_s: float = DRAIN_JOIN_S) -> None:
        """The drains have every line the child wrote before it exited (a grandchild that holds
        the pipe open keeps its drain running: the wait is bounded)."""
        deadline = time.monotonic() + timeout_s
        for t in self._drains:
            t.join(max(0.0, deadline - time.monotonic()))

