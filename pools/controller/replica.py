"""A replica: starts its engine process with the plan's GPUs, NUMA CPUs and NICs, reports its URL
and the environment the engine really got, answers health checks, restarts the engine when it
dies, and says when it is idle (so a drained replica stops only after its last request)."""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from pools.controller.pinning import pin_cpus
from pools.controller.spec import ENGINE_ENV, EngineLaunch
from topology.readers.cpus import format_cpu_list


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
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.restarts = 0
        self.notes: list[str] = list(launch.pin.notes)

    def start(self) -> str:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()  # the previous (dead) engine's pipe
        # ISLE_PARENT_PID: the engine dies with this actor instead of lingering as an orphan
        env = {**os.environ, **self.launch.environment(), "PYTHONUNBUFFERED": "1", "ISLE_PARENT_PID": str(os.getpid())}
        self.proc = subprocess.Popen([sys.executable, *self.launch.command()], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env=env)
        self._pin_cpus(self.proc.pid)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + self.launch.ready_timeout_s
        while time.monotonic() < deadline:
            if select.select([self.proc.stdout], [], [], 0.2)[0]:
                line = self.proc.stdout.readline()
                if "ready:" in line:
                    self.url = line.split("ready:")[1].strip().removesuffix("/v1")
                    return self.url
            if self.proc.poll() is not None:
                break
        code = self.proc.poll()
        self.stop()
        raise RuntimeError(f"replica {self.launch.replica_id}: engine did not start (exit {code})")

    def _pin_cpus(self, pid: int) -> None:
        pin_cpus(pid, self.launch.pin.cpus, self.notes)

    def healthy(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def idle(self) -> bool:
        """No request running or waiting in the engine (a dead engine is idle)."""
        if self.proc is None or self.proc.poll() is not None:
            return True
        try:
            with urllib.request.urlopen(f"{self.url}/metrics", timeout=2) as resp:
                text = resp.read().decode("utf-8", "replace")
        except OSError:
            return True
        busy = 0.0
        for line in text.splitlines():
            if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")):
                with contextlib.suppress(ValueError):
                    busy += float(line.rsplit(" ", 1)[1])
        return busy == 0

    def ensure(self) -> str:
        """Restart a dead engine; the URL (port) may change."""
        if self.proc is not None and self.proc.poll() is None:
            return self.url
        self.restarts += 1
        return self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def info(self) -> dict[str, Any]:
        pid = self.proc.pid if self.proc is not None and self.proc.poll() is None else None
        affinity = None
        if pid is not None:
            with contextlib.suppress(OSError):
                affinity = format_cpu_list(sorted(os.sched_getaffinity(pid)))
        return {"replica_id": self.launch.replica_id, "node": self.launch.node, "gpus": list(self.launch.gpus),
                "url": self.url, "restarts": self.restarts, "pid": pid, "generation": self.launch.generation,
                "env": engine_environment(pid, self.launch.environment()) if pid else {},
                "cpu_affinity": affinity, "pinned_cpus": format_cpu_list(list(self.launch.pin.cpus)),
                "notes": list(self.notes)}
