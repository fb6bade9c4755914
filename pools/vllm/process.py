"""Run one vLLM OpenAI server: start it in its own process group, stream its log, wait for
`/health`, stop it (SIGTERM to the group, SIGKILL after a grace period).

Errors (one class, `EngineStartError`, a RuntimeError):
- the engine exits before `/health` answers -> its exit code and its last log lines;
- `/health` does not answer within the timeout -> the engine is stopped, and its last lines.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO

from pools.controller.pinning import pin_cpus
from pools.vllm.command import VllmServer, command, environment
from pools.wire.lifecycle import follow_parent

log = logging.getLogger("isleserve.vllm")
READY_TIMEOUT_S = 600.0
"""A cold vLLM start (weights, torch.compile, CUDA graphs) takes minutes on big models."""
STOP_GRACE_S = 20.0
TAIL_LINES = 40


class EngineStartError(RuntimeError):
    """The engine did not come up; the message ends with its last log lines."""

    def __init__(self, replica_id: str, reason: str, tail: list[str], exit_code: int | None = None) -> None:
        shown = "\n".join(f"  | {line}" for line in tail) if tail else "  (it printed nothing)"
        super().__init__(f"vLLM replica {replica_id}: {reason}; its last {len(tail)} log lines:\n{shown}")
        self.replica_id, self.reason, self.tail, self.exit_code = replica_id, reason, tail, exit_code


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on now (vLLM needs its port on the command line)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_free(host: str, port: int) -> bool:
    """Nobody listens on `port` at `host` now, and it can be bound there."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free to listen on
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def probe(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def _stop_with_starter(starter: int) -> None:
    """In the vLLM server, between fork and exec: SIGTERM when the thread that started it ends
    (Linux PR_SET_PDEATHSIG; kept across exec), so a replica actor killed outright does not leave a
    server holding its GPUs and ports. vLLM shuts its engine processes down on SIGTERM. Only
    system calls here: safe in a forked child."""
    if follow_parent(signal.SIGTERM) and os.getppid() != starter:  # it died before we asked to follow it
        os._exit(1)


class VllmProcess:
    """One server process. `python` is the vLLM environment's interpreter (vLLM lives in its own
    environment, apart from the product's); `log_path` also receives the engine's log."""

    def __init__(self, server: VllmServer, python: str = sys.executable, *, log_path: str | Path | None = None,
                 ready_timeout_s: float = READY_TIMEOUT_S, tail_lines: int = TAIL_LINES,
                 health: Callable[[str], bool] = probe, die_with_starter: bool = False) -> None:
        self.server, self.python = server, python
        self.die_with_starter = die_with_starter
        """The server gets SIGTERM when the thread that calls start() ends: for a starter whose
        thread lives as long as it (a replica actor's), not for a pool thread."""
        self.log_path = Path(log_path) if log_path is not None else None
        self.ready_timeout_s, self.health = ready_timeout_s, health
        self.proc: subprocess.Popen[str] | None = None
        self.notes: list[str] = []
        self._tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self._reader: threading.Thread | None = None

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def tail(self) -> list[str]:
        return list(self._tail)

    def start(self) -> str:
        """Start the server and wait until `/health` answers; its URL (without /v1)."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"vLLM replica {self.server.replica_id} is already running (pid {self.proc.pid})")
        self._tail.clear()
        argv = command(self.server, self.python)
        log.info("vLLM replica %s: %s", self.server.replica_id, " ".join(argv))
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, errors="replace", env={**os.environ, **environment(self.server)},
                                     start_new_session=True,  # its own group: stop() reaches the engine's children
                                     preexec_fn=functools.partial(_stop_with_starter, os.getpid())  # noqa: PLW1509
                                     if self.die_with_starter else None)
        self._pin_cpus(self.proc.pid)
        assert self.proc.stdout is not None
        self._reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True,
                                        name=f"vllm-log-{self.server.replica_id}")
        self._reader.start()
        self._wait_ready()
        return self.url

    def _pin_cpus(self, pid: int) -> None:
        pin_cpus(pid, self.server.cpus, self.notes)

    def _read(self, stream: IO[str]) -> None:
        sink = self.log_path.open("a", encoding="utf-8") if self.log_path is not None else None
        try:
            for raw in stream:
                line = raw.rstrip("\n")
                self._tail.append(line)
                log.info("[%s] %s", self.server.replica_id, line)
                if sink is not None:
                    sink.write(raw)
                    sink.flush()
        except ValueError:  # the pipe was closed under us by stop()
            pass
        finally:
            if sink is not None:
                sink.close()

    def _wait_ready(self) -> None:
        assert self.proc is not None
        started = time.monotonic()
        deadline = started + self.ready_timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                self.stop(grace_s=5.0)  # what it started may still run
                raise EngineStartError(self.server.replica_id, f"the engine exited with code {code} "
                                       f"{time.monotonic() - started:.1f} s after start, before /health answered",
                                       self.tail(), code)
            if self.health(self.url):
                log.info("vLLM replica %s ready at %s after %.1f s", self.server.replica_id, self.url,
                         time.monotonic() - started)
                return
            if time.monotonic() >= deadline:
                self.stop()
                raise EngineStartError(self.server.replica_id, f"/health at {self.url} did not answer within "
                                       f"{self.ready_timeout_s:g} s (the engine was stopped)", self.tail())
            time.sleep(0.5)

    def _drain_log(self) -> None:
        """The reader has every line the engine wrote before it exited."""
        if self._reader is not None:
            self._reader.join(5.0)

    def healthy(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.health(self.url)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = STOP_GRACE_S) -> int | None:
        """SIGTERM to the process group, SIGKILL to what is left after `grace_s`; the exit code."""
        proc = self.proc
        if proc is None:
            return None
        group = proc.pid  # start_new_session: the group id is the leader's pid
        _signal_group(group, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            log.warning("vLLM replica %s: no exit %g s after SIGTERM, killing it", self.server.replica_id, grace_s)
        _wait_group(group, max(0.0, grace_s / 4))  # the engine core and workers leave after the API server
        _signal_group(group, signal.SIGKILL)
        code = proc.wait()
        self._drain_log()
        if proc.stdout is not None:
            proc.stdout.close()
        return code


def _signal_group(group: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, sig)


def _wait_group(group: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.1)
