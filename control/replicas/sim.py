"""A replica: starts its engine process with the plan's GPUs, NUMA CPUs and NICs, reports its URL
and the environment the engine really got, answers health checks, restarts the engine when it
dies or hangs (alive, not answering: control.replicas.liveness), and says when it is idle (so a
drained replica stops only after its last request)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from control.replicas.liveness import answers_within
from control.spec import ENGINE_ENV, EngineLaunch
from pools.pinning import pin_cpus
from topology.readers.cpus import format_cpu_list
from wire import client
from wire.openai import ADMIN_TOKEN_ENV, API_KEY_ENV
from wire.processes import ChildError, ReadyLine, tail_block
from wire.promtext import engine_load
from wire.supervisor import Child

log = logging.getLogger("isleserve.controller")


def engine_environment(pid: int, fallback: dict[str, str]) -> dict[str, str]:
    """The pinning variables as the engine process sees them (/proc), else what was passed."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {k: v for k, v in fallback.items() if k in ENGINE_ENV}
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {k.decode(): v.decode() for k, _, v in pairs if k.decode() in ENGINE_ENV}


class ReplicaProcess:
    """Plain Python (the Ray actor wraps it): testable without Ray."""

    def __init__(self, launch: EngineLaunch) -> None:
        self.launch = launch
        self.proc: Child | None = None
        self.url = ""
        self.restarts = 0
        self.hung = 0
        """Restarts of an engine that was alive but did not answer."""
        self.notes: list[str] = list(launch.pin.notes)

    def start(self) -> str:
        # ISLE_PARENT_PID: the engine dies with this actor instead of lingering as an orphan (it
        # follows the thread that started it itself, so no parent_death here)
        env = {**os.environ, **self.launch.environment(), "PYTHONUNBUFFERED": "1", "ISLE_PARENT_PID": str(os.getpid()),
               **({ADMIN_TOKEN_ENV: self.launch.admin_token} if self.launch.admin_token else {}),
               **({API_KEY_ENV: self.launch.api_key} if self.launch.api_key else {})}
        self.proc = Child([sys.executable, *self.launch.command()], name=f"replica {self.launch.replica_id}",
                          ready=ReadyLine("ready:"), env=env, parent_death=None).start()
        self._pin_cpus(self.proc.pid)
        try:
            line = self.proc.wait_ready(self.launch.ready_timeout_s, poll_s=0.2)
        except ChildError as err:  # stopped
            raise RuntimeError(f"replica {self.launch.replica_id}: engine did not start (exit {err.exit_code}); "
                               f"{tail_block(err.tail)}") from None
        self.url = line.split("ready:")[1].strip().removesuffix("/v1")
        return self.url

    def _pin_cpus(self, pid: int) -> None:
        pin_cpus(pid, self.launch.pin.cpus, self.notes)

    def healthy(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            return False
        return client.healthy(self.url, timeout_s=2)

    def idle(self) -> bool:
        """No request running or waiting in the engine (a dead engine is idle)."""
        if self.proc is None or self.proc.poll() is not None:
            return True
        try:
            return engine_load(client.get_text(f"{self.url}/metrics", timeout_s=2)).busy == 0
        except (OSError, ValueError):  # no answer, or not Prometheus text
            return True

    def ensure(self) -> str:
        """Restart a dead engine, or a hung one (alive, but `/health` did not answer for
        `HUNG_AFTER_S`: killed first); the URL (port) may change."""
        if self.proc is not None and self.proc.poll() is None:
            if answers_within(lambda timeout_s: client.healthy(self.url, timeout_s=timeout_s)):
                return self.url
            log.warning("replica %s: engine pid %d is alive but has not answered /health: hung, killing it",
                        self.launch.replica_id, self.proc.pid)
            self.proc.stop(grace_s=0.0)  # SIGKILL: a stopped process acts on nothing else
            self.hung += 1
        self.restarts += 1
        return self.start()

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.running():
                self.proc.terminate()
                with contextlib.suppress(OSError):  # a stopped (hung) engine acts on SIGTERM once continued
                    self.proc.send_signal(signal.SIGCONT)
            self.proc.stop()  # SIGTERM, SIGKILL after 10 s

    def info(self) -> dict[str, Any]:
        pid = self.proc.pid if self.proc is not None and self.proc.poll() is None else None
        affinity = None
        if pid is not None:
            with contextlib.suppress(OSError):
                affinity = format_cpu_list(sorted(os.sched_getaffinity(pid)))
        return {"replica_id": self.launch.replica_id, "node": self.launch.node, "gpus": list(self.launch.gpus),
                "url": self.url, "restarts": self.restarts, "hung_restarts": self.hung, "pid": pid,
                "generation": self.launch.generation,
                "env": engine_environment(pid, self.launch.environment()) if pid else {},
                "cpu_affinity": affinity, "pinned_cpus": format_cpu_list(list(self.launch.pin.cpus)),
                "notes": list(self.notes)}
