"""The controller's edges, as one small protocol: discover the topology, list the cluster's
nodes, create or reattach replicas, run the topology bench. `RayBackend` (control.actors)
is the real one; `LocalBackend` runs engines and benches as child processes of the caller
(tests, no Ray)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from control.benches.local import bench_here
from control.benches.schedule import Subject
from control.nodecheck import RayNode
from control.replicas.sim import ReplicaProcess
from control.spec import EngineLaunch
from topology import Topology, read_source
from topology.bench.record import BenchRecord
from topology.bench.run import BenchSettings


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

    def bench(self, topology: Topology, due: Sequence[Subject], settings: BenchSettings, source: str
              ) -> dict[str, BenchRecord | str]:
        """Each subject's bench record (a node, or a pair of nodes), or why there is none."""
        ...


def engine_for(launch: EngineLaunch, host_ip: str, die_with_starter: bool = False) -> Replica:
    """The simulated engine's process, or a real vLLM server listening on `host_ip` (this node's
    address); with `die_with_starter` the vLLM server stops when the calling thread ends (the
    simulated engine always follows its parent, ISLE_PARENT_PID)."""
    if launch.vllm is None:
        return ReplicaProcess(launch)
    from control.replicas.vllm.launch import replica_for

    return replica_for(launch, host_ip, die_with_starter)


class LocalBackend:
    """Engines as child processes, the declared topology as is, no nodes to bind or watch."""

    def session(self) -> str:
        return f"local-{os.getpid()}"

    def discover(self, source: str) -> Discovery:
        return Discovery(topology=read_source(source), simulated=source != "nvml")

    def nodes(self) -> list[RayNode] | None:
        return None

    def create(self, launch: EngineLaunch) -> Replica:
        return engine_for(launch, "127.0.0.1")

    def attach(self, launch: EngineLaunch) -> Replica | None:
        return None

    def bench(self, topology: Topology, due: Sequence[Subject], settings: BenchSettings, source: str
              ) -> dict[str, BenchRecord | str]:
        return bench_here(topology, due, settings, source)
