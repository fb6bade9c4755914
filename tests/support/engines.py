"""Start simulated engines as real processes, as users and the controller do."""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import ROOT
from tests.support.wait import wait_until
from wire.processes import ChildError, ChildExited, ChildNotReady, ReadyLine
from wire.supervisor import Child

ROUTER_READY_S = 60.0


@dataclass
class EngineProcess:
    proc: Child
    url: str

    @property
    def base(self) -> str:
        return self.url.removesuffix("/v1")


def start_engine(*args: str, timeout_s: float = 30.0) -> EngineProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = Child([sys.executable, "-m", "pools", "sim-engine", "--port", "0", "--admin-routes", *args], name="engine",
                 ready=ReadyLine("ready:"), cwd=ROOT, env=env).start()
    try:
        line = proc.wait_ready(timeout_s, poll_s=0.2)  # stopped when it does not come up
    except ChildExited as err:
        raise RuntimeError(f"engine exited {err.exit_code}: " + "\n".join(err.tail)) from None
    except ChildNotReady:
        raise RuntimeError("engine did not become ready") from None
    return EngineProcess(proc=proc, url=line.split("ready:")[1].strip())


def stop_engine(engine: EngineProcess) -> None:
    engine.proc.stop()  # SIGTERM, SIGKILL after 10 s


def fault(engine: EngineProcess, spec: Mapping[str, object]) -> None:
    """Set an engine's faults (its /admin/faults: engines here start with --admin-routes)."""
    req = urllib.request.Request(f"{engine.base}/admin/faults", data=json.dumps(spec).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        resp.read()


@contextmanager
def running_engine(*args: str) -> Iterator[EngineProcess]:
    engine = start_engine(*args)
    try:
        yield engine
    finally:
        stop_engine(engine)


@contextmanager
def running_router(config: Mapping[str, Any], directory: Path) -> Iterator[tuple[Child, str]]:
    """`python -m router --config` with this config, as a user starts it: (process, its /v1 URL)."""
    path = directory / "router.yaml"
    path.write_text(yaml.safe_dump(dict(config)))
    proc = Child([sys.executable, "-m", "router", "--config", str(path)], name="router", ready=ReadyLine("ready:"),
                 cwd=ROOT).start()
    try:
        try:
            line = proc.wait_ready(ROUTER_READY_S)
        except ChildError as err:
            raise AssertionError(str(err)) from None
        yield proc, line.split("ready:")[1].strip()
    finally:
        proc.stop()


def wait_until_idle(base: str, admin_key: str, replica_ids: Iterable[str], timeout_s: float = 15.0) -> None:
    """Until the router's own view of these replicas (its `/admin/replicas`: the scraped running
    and waiting, its requests in flight) is idle. The PD-or-mixed choice weighs that load, so a
    test that expects a long prompt to split waits for the last request's load to clear first:
    on a slow machine the router's last scrape can still show it."""
    wanted, rows = set(replica_ids), list[dict[str, Any]]()

    def idle() -> bool:
        nonlocal rows
        req = urllib.request.Request(f"{base}/admin/replicas", headers={"authorization": f"Bearer {admin_key}"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            rows = [r for r in json.loads(resp.read())["replicas"] if r["replica_id"] in wanted]
        return len(rows) == len(wanted) and not any(r["running"] or r["waiting"] or r["inflight"] for r in rows)

    def seen() -> str:
        return ", ".join(f"{r['replica_id']}: {r['running']}/{r['waiting']}/{r['inflight']}" for r in rows)

    wait_until(idle, timeout_s, "replicas idle (running/waiting/in flight)", seen=seen)
