"""Start simulated engines as real processes, as users and the controller do."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import ROOT


@dataclass
class EngineProcess:
    proc: subprocess.Popen[str]
    url: str

    @property
    def base(self) -> str:
        return self.url.removesuffix("/v1")


def start_engine(*args: str, timeout_s: float = 30.0) -> EngineProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "pools", "sim-engine", "--port", "0", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            line = proc.stdout.readline()
            if "ready:" in line:
                return EngineProcess(proc=proc, url=line.split("ready:")[1].strip())
        if proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else ""
            stop_engine(EngineProcess(proc=proc, url=""))
            raise RuntimeError(f"engine exited {proc.returncode}: {err}")
    stop_engine(EngineProcess(proc=proc, url=""))
    raise RuntimeError("engine did not become ready")


def stop_engine(engine: EngineProcess) -> None:
    if engine.proc.poll() is None:
        engine.proc.send_signal(signal.SIGTERM)
        try:
            engine.proc.wait(10)
        except subprocess.TimeoutExpired:
            engine.proc.kill()
            engine.proc.wait()
    for pipe in (engine.proc.stdout, engine.proc.stderr):
        if pipe is not None:
            pipe.close()


@contextmanager
def running_engine(*args: str) -> Iterator[EngineProcess]:
    engine = start_engine(*args)
    try:
        yield engine
    finally:
        stop_engine(engine)


@contextmanager
def running_router(config: Mapping[str, Any], directory: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`python -m router --config` with this config, as a user starts it: (process, its /v1 URL)."""
    path = directory / "router.yaml"
    path.write_text(yaml.safe_dump(dict(config)))
    proc = subprocess.Popen([sys.executable, "-m", "router", "--config", str(path)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "ready:" in line, proc.stderr.read() if proc.stderr else ""
        yield proc, line.split("ready:")[1].strip()
    finally:
        proc.terminate()
        proc.wait(10)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
