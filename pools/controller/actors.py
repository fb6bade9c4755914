"""The Ray actors: a detached, named controller and one replica actor per placement."""

from __future__ import annotations

import threading
from typing import Any

import ray

from pools.controller.controller import CONTROLLER_NAME, NAMESPACE, ControllerCore, ControllerSpec
from pools.controller.replica import ReplicaProcess
from pools.controller.spec import EngineLaunch
from pools.routing import RoutingTable

HEALTH_INTERVAL_S = 2.0


class _ReplicaActor:
    def __init__(self, launch: EngineLaunch) -> None:
        self.process = ReplicaProcess(launch)

    def start(self) -> str:
        return self.process.start()

    def healthy(self) -> bool:
        return self.process.healthy()

    def ensure(self) -> str:
        return self.process.ensure()

    def stop(self) -> None:
        self.process.stop()

    def info(self) -> dict[str, Any]:
        return self.process.info()


_remote: Any = ray.remote  # Ray's overloads do not type a class decorated with options
ReplicaActor: Any = _remote(num_cpus=0)(_ReplicaActor)


class _RemoteReplica:
    """The controller's view of a replica actor (the Replica protocol, over ray.get)."""

    def __init__(self, launch: EngineLaunch) -> None:
        self.actor = ReplicaActor.options(name=f"isleserve-{launch.replica_id}", namespace=NAMESPACE).remote(launch)

    def start(self) -> str:
        return str(ray.get(self.actor.start.remote()))

    def healthy(self) -> bool:
        return bool(ray.get(self.actor.healthy.remote()))

    def ensure(self) -> str:
        return str(ray.get(self.actor.ensure.remote()))

    def stop(self) -> None:
        ray.get(self.actor.stop.remote())
        ray.kill(self.actor)


class _ControllerActor:
    def __init__(self, spec: ControllerSpec) -> None:
        self.core = ControllerCore(spec, _RemoteReplica)
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.loop: threading.Thread | None = None

    def deploy(self) -> RoutingTable:
        with self.lock:
            if self.core.table.version == 0:
                self.core.deploy()
                self.loop = threading.Thread(target=self._health_loop, daemon=True)
                self.loop.start()
            return self.core.table

    def _health_loop(self) -> None:
        while not self.stopping.wait(HEALTH_INTERVAL_S):
            with self.lock:
                self.core.check()

    def table(self) -> RoutingTable:
        return self.core.table

    def plan(self) -> dict[str, Any] | None:
        return self.core.plan.to_json() if self.core.plan is not None else None

    def topology(self) -> Any:
        return self.core.topology

    def shutdown(self) -> None:
        self.stopping.set()
        with self.lock:
            self.core.shutdown()


ControllerActor: Any = _remote(num_cpus=0, max_concurrency=4)(_ControllerActor)


def get_or_create_controller(spec: ControllerSpec) -> Any:
    return ControllerActor.options(name=CONTROLLER_NAME, namespace=NAMESPACE, lifetime="detached",
                                   get_if_exists=True).remote(spec)
