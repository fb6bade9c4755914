"""What the simulator's helpers (`faults`, `autoscale`, `prefix`) see of a running simulation: its
replicas, the router's snapshot of them, the request table and the event queue's entry point
(`loadtest.sim.cluster.Simulation` is one)."""

from __future__ import annotations

from typing import Any, Protocol

from loadtest.model import RequestResult
from loadtest.sim.model import SimConfig, _Req
from loadtest.sim.network import Network
from loadtest.sim.replica import SimReplica
from physics.kvpath import KvPathFault
from router.plugins.model import Candidate
from topology import Topology


class SimState(Protocol):
    config: SimConfig
    topology: Topology
    replicas: dict[str, SimReplica]
    by_model: dict[str, list[SimReplica]]
    snapshots: dict[str, list[Candidate]]
    slots: dict[str, tuple[list[Candidate], int]]
    cands: dict[str, Candidate]
    reqs: dict[str, _Req]
    results: list[RequestResult]
    events: list[tuple[float, int, int, Any, int]]
    log: list[dict[str, Any]]
    network: Network
    transfers: dict[int, _Req]
    kv_faults: dict[tuple[str, str], KvPathFault]
    next_transfer: int
    pulled: int

    def _at(self, t: float, kind: int, obj: Any = None, version: int = 0) -> None: ...
    def _refresh(self, r: SimReplica) -> None: ...
    def _record(self, req: _Req, t: float, outcome: str) -> None: ...
    def _route(self, t: float, req: _Req) -> None: ...
    def _assign(self, t: float, rep: SimReplica, req: _Req, max_tokens: int, hold: bool = False,
                remote: bool = False) -> None: ...
    def _schedule_net(self) -> None: ...
