"""A vLLM replica: the controller's Replica protocol (start, healthy, ensure, idle, stop, info)
over one `VllmProcess`, in this process (a local backend) or inside the same replica actor as a
simulated engine, pinned the same way (node affinity, the planned GPUs' `isle_gpu_<node>_<i>`
resources; control.actors, built from the launch by control.replicas.vllm.launch).

Before it starts the server it checks that the ports the controller gave it are free on this
host: a port some other process holds is `PortInUse` (the controller then picks another), not an
engine that dies of EADDRINUSE a minute later."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any

from control.replicas.liveness import answers_within
from control.replicas.sim import engine_environment
from control.replicas.vllm.command import VllmServer
from control.replicas.vllm.process import READY_TIMEOUT_S, EngineStartError, VllmProcess, port_free
from pools.ports import PortInUse
from wire import client
from wire.promtext import engine_load


def busy_requests(metrics_text: str) -> float:
    """Requests running or waiting, from vLLM's Prometheus text (ValueError: not that)."""
    return engine_load(metrics_text).busy


class VllmReplica:
    def __init__(self, server: VllmServer, python: str, log_dir: str | None = None,
                 ready_timeout_s: float = READY_TIMEOUT_S, node: str = "", generation: int = 0,
                 die_with_starter: bool = False) -> None:
        self.server, self.python, self.log_dir, self.ready_timeout_s = server, python, log_dir, ready_timeout_s
        self.die_with_starter = die_with_starter
        self.node, self.generation = node or "this host", generation
        self.restarts = 0
        self.process = self._process(server)

    def _process(self, server: VllmServer) -> VllmProcess:
        name = f"{server.replica_id}-g{self.generation}.log"
        log_path = Path(self.log_dir) / name if self.log_dir else None
        if log_path is not None:
            log_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # private, as the state_dir it is in
        return VllmProcess(server, self.python, log_path=log_path, ready_timeout_s=self.ready_timeout_s,
                           die_with_starter=self.die_with_starter)

    def _check(self, server: VllmServer) -> None:
        if shutil.which(self.python) is None:
            raise EngineStartError(server.replica_id, f"no vLLM Python at {self.python} on {self.node} (set the "
                                   "config's vllm.python or vllm.venv)", [])
        for port in (server.port, server.side_channel_port):
            if port is not None and not port_free(server.host, port):
                raise PortInUse(self.node, port)

    def start(self) -> str:
        self._check(self.process.server)
        return self.process.start()

    def healthy(self) -> bool:
        return self.process.healthy()

    def ensure(self) -> str:
        """Restart a dead engine, or a hung one (alive, not answering `/health` for `HUNG_AFTER_S`:
        control.replicas.liveness), under a new KV engine id (its peers cached the old one's
        handshake)."""
        if self.process.running():
            if answers_within(lambda timeout_s: client.healthy(self.process.url, timeout_s=timeout_s)):
                return self.process.url
            self.process.stop(grace_s=0.0)  # hung: SIGKILL to its group (a stopped process acts on nothing else)
        self.process.stop(grace_s=5.0)
        self.restarts += 1
        engine_id = f"{self.server.kv_engine_id}-r{self.restarts}-{uuid.uuid4().hex[:6]}"
        self.process = self._process(dataclasses.replace(self.server, engine_id=engine_id))
        self._check(self.process.server)
        return self.process.start()

    def idle(self) -> bool:
        """No request running or waiting (a dead engine is idle)."""
        if not self.process.running():
            return True
        try:
            return busy_requests(client.get_text(f"{self.process.url}/metrics", timeout_s=2)) == 0
        except (OSError, ValueError):  # no answer, or not Prometheus text
            return True

    def stop(self) -> None:
        self.process.stop()

    def info(self) -> dict[str, Any]:
        pid = self.process.pid if self.process.running() else None
        server = self.process.server
        info: dict[str, Any] = {
            "replica_id": server.replica_id, "engine": "vllm", "url": server.url, "role": server.role, "tp": server.tp,
            "kv_engine_id": server.kv_engine_id, "restarts": self.restarts, "pid": pid, "node": self.node,
            "generation": self.generation, "ports": {"http": server.port, "side_channel": server.side_channel_port},
            "env": engine_environment(pid, dict(server.pin_env)) if pid else {},
            "cpu_affinity": sorted(os.sched_getaffinity(pid)) if pid else None, "notes": list(self.process.notes)}
        ray: Any = sys.modules.get("ray")  # inside a Ray actor: where Ray put it
        if ray is not None and ray.is_initialized():
            ctx = ray.get_runtime_context()
            info.update(ray_node_id=ctx.get_node_id(), ray_resources=ctx.get_assigned_resources())
        return info

