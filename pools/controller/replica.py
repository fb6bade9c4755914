"""A replica actor: starts its engine process with the plan's GPUs, reports its URL, answers
health checks, restarts the engine when it dies."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
import urllib.request
from typing import Any

from pools.controller.spec import EngineLaunch

READY_TIMEOUT_S = 60.0


class ReplicaProcess:
    """Plain Python (the Ray actor wraps it): testable without Ray."""

    def __init__(self, launch: EngineLaunch) -> None:
        self.launch = launch
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.restarts = 0

    def start(self) -> str:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()  # the previous (dead) engine's pipe
        # ISLE_PARENT_PID: the engine dies with this actor instead of lingering as an orphan
        env = {**os.environ, **self.launch.environment(), "PYTHONUNBUFFERED": "1", "ISLE_PARENT_PID": str(os.getpid())}
        self.proc = subprocess.Popen([sys.executable, *self.launch.command()], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env=env)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
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

    def healthy(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

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
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def info(self) -> dict[str, Any]:
        return {"replica_id": self.launch.replica_id, "url": self.url, "restarts": self.restarts,
                "pid": self.proc.pid if self.proc else None}
