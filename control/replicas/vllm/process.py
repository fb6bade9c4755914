"""Run one vLLM OpenAI server (a wire.supervisor child): start it in a session of its own,
stream its log, wait for `/health`, stop it (SIGTERM to the group, SIGKILL after a grace period).

Errors (one class, `EngineStartError`, a RuntimeError):
- the engine exits before `/health` answers -> its exit code and its last log lines;
- `/health` does not answer within the timeout -> the engine is stopped, and its last lines.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

from control.replicas.vllm.command import VllmServer, command, environment
from pools.pinning import pin_cpus
from wire import client
from wire.processes import ChildExited, ChildNotReady, Group, Output, ReadyProbe, Stop
from wire.supervisor import Child

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
    return client.healthy(url, timeout_s)


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
        self.proc: Child | None = None
        self.notes: list[str] = []
        self.tail_lines = tail_lines

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def tail(self) -> list[str]:
        return self.proc.tail() if self.proc is not None else []

    def start(self) -> str:
        """Start the server and wait until `/health` answers; its URL (without /v1)."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"vLLM replica {self.server.replica_id} is already running (pid {self.proc.pid})")
        argv = command(self.server, self.python)
        log.info("vLLM replica %s: %s", self.server.replica_id, " ".join(argv))
        self.proc = Child(argv, name=f"vLLM replica {self.server.replica_id}", ready=ReadyProbe(self._answers),
                          env={**os.environ, **environment(self.server)},
                          group=Group.SESSION,  # its own group: stop() reaches the engine's children
                          stdin=Output.DEVNULL, stderr=Output.STDOUT, log_path=self.log_path, on_line=self._log_line,
                          tail_lines=self.tail_lines,
                          # a replica actor killed outright leaves no server holding its GPUs and ports
                          # (vLLM shuts its engine processes down on SIGTERM)
                          parent_death=signal.SIGTERM if self.die_with_starter else None,
                          stop=Stop(to_group=True, grace_s=STOP_GRACE_S, linger_s=STOP_GRACE_S / 4)).start()
        self._pin_cpus(self.proc.pid)
        self._wait_ready(self.proc)
        return self.url

    def _pin_cpus(self, pid: int) -> None:
        pin_cpus(pid, self.server.cpus, self.notes)

    def _answers(self) -> bool:
        return self.health(self.url)

    def _log_line(self, line: str) -> None:
        log.info("[%s] %s", self.server.replica_id, line)

    def _wait_ready(self, proc: Child) -> None:
        started = time.monotonic()
        try:
            proc.wait_ready(self.ready_timeout_s, stop_on_failure=False)
        except ChildExited as err:
            self.stop(grace_s=5.0)  # what it started may still run
            raise EngineStartError(self.server.replica_id, f"the engine exited with code {err.exit_code} "
                                   f"{err.elapsed_s:.1f} s after start, before /health answered",
                                   self.tail(), err.exit_code) from None
        except ChildNotReady:
            self.stop()
            raise EngineStartError(self.server.replica_id, f"/health at {self.url} did not answer within "
                                   f"{self.ready_timeout_s:g} s (the engine was stopped)", self.tail()) from None
        log.info("vLLM replica %s ready at %s after %.1f s", self.server.replica_id, self.url,
                 time.monotonic() - started)

    def healthy(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.health(self.url)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = STOP_GRACE_S) -> int | None:
        """SIGTERM to the process group, SIGKILL to what is left after `grace_s` (and a quarter of
        it for the engine core and workers, which leave after the API server); the exit code."""
        if self.proc is None:
            return None
        return self.proc.stop(grace_s, linger_s=max(0.0, grace_s / 4))
