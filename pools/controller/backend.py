"""The controller's edges, as one small protocol: discover the topology, list the cluster's
nodes, create or reattach replicas. `RayBackend` (pools.controller.actors) is the real one;
`LocalBackend` runs engines as child processes of the caller (tests, no Ray)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pools.controller.nodecheck import RayNode
from pools.controller.replica import ReplicaProcess
from pools.controller.spec import EngineLaunch
from topology import Topology, read_source


class Replica(Protocol):
    def start(self) -> str: ...

    def healthy(self) -> bool: ...

    def ensure(self) -> str: ...

    def idle(self) -> bool: ...

    def stop(self) -> None: ...

    def info(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Discovery:
    topology: Topology
    bindings: Mapping[str, RayNode] = field(default_factory=dict)
    """Topology node -> the Ray node that is it (NVML) or carries it (simulation)."""
    simulated: bool = True


class Backend(Protocol):
    def session(self) -> str:
        """Identifies the cluster: a saved state from another one is not resumed."""
        ...

    def discover(self, source: str) -> Discovery: ...

    def nodes(self) -> list[RayNode] | None:
        """The cluster's nodes now (None: nothing to watch)."""
        ...

    def create(self, launch: EngineLaunch) -> Replica: ...

    def attach(self, launch: EngineLaunch) -> Replica | None:
        """The replica a previous controller started, if it still runs."""
        ...


class LocalBackend:
    """Engines as child processes, the declared topology as is, no nodes to bind or watch."""

    def session(self) -> str:
        return f"local-{os.getpid()}"

    def discover(self, source: str) -> Discovery:
        return Discovery(topology=read_source(source), simulated=source != "nvml")

    def nodes(self) -> list[RayNode] | None:
        return None

    def create(self, launch: EngineLaunch) -> Replica:
        return ReplicaProcess(launch)

    def attach(self, launch: EngineLaunch) -> Replica | None:
        return None
