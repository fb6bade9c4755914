"""The controller: topology -> plan -> one replica per placement -> a versioned routing table,
then a health loop that restarts dead engines and publishes the new table. Every topology and
plan goes to a JSON-lines record with its fingerprint.

`ControllerCore` is plain Python over an injected replica factory (tests run it without Ray);
`ControllerActor` is the detached, named Ray actor around it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pools.controller.spec import EngineLaunch
from pools.model import DEFAULT_SLO_CLASSES, PlacementPlan, PlacementRequest, PoolSpec, SLOClass
from pools.placement import get_policy
from pools.routing import RoutingTable, table_from_plan
from topology import Topology, read_source

CONTROLLER_NAME, NAMESPACE = "isleserve-controller", "isleserve"


class Replica(Protocol):
    def start(self) -> str: ...

    def healthy(self) -> bool: ...

    def ensure(self) -> str: ...

    def stop(self) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ControllerSpec:
    topology_source: str
    engine: str
    policy: str
    pools: tuple[PoolSpec, ...]
    slo_classes: Mapping[str, SLOClass] = field(default_factory=lambda: {c.name: c for c in DEFAULT_SLO_CLASSES})
    time_scale: float = 1.0
    state_dir: str = "/tmp/isleserve"


class ControllerCore:
    def __init__(self, spec: ControllerSpec, make_replica: Callable[[EngineLaunch], Replica]) -> None:
        if spec.engine != "sim":
            raise ValueError("this controller launches simulated engines; vLLM replicas come with the vLLM launcher")
        self.spec = spec
        self.make_replica = make_replica
        self.replicas: dict[str, Replica] = {}
        self.urls: dict[str, str] = {}
        self.topology: Topology | None = None
        self.plan: PlacementPlan | None = None
        self.table = RoutingTable(version=0, replicas=())

    def _record(self, kind: str, payload: dict[str, Any]) -> None:
        path = Path(self.spec.state_dir)
        path.mkdir(parents=True, exist_ok=True)
        with (path / "events.jsonl").open("a") as f:
            f.write(json.dumps({"time": time.time(), "kind": kind, **payload}) + "\n")

    def _launch(self, topology: Topology, plan: PlacementPlan) -> list[EngineLaunch]:
        out = []
        for p in plan.placements:
            pool = plan.pool(p.pool)
            gpu = topology.node(p.node).gpu(p.gpus[0]).model
            if pool.model is None or gpu is None:
                raise ValueError(f"{p.replica_id}: a simulated replica needs the pool's model and the GPU's model")
            out.append(EngineLaunch(replica_id=p.replica_id, pool=p.pool, role=p.role, model=pool.model, gpu=gpu,
                                    tp=pool.tp, node=p.node, gpus=p.gpus, topology_source=self.spec.topology_source,
                                    time_scale=self.spec.time_scale))
        return out

    def deploy(self) -> RoutingTable:
        """Discover, plan, start every replica, publish the first table."""
        topology = read_source(self.spec.topology_source)
        request = PlacementRequest(topology=topology, pools=self.spec.pools, slo_classes=self.spec.slo_classes)
        plan = get_policy(self.spec.policy).place(request)
        self.topology, self.plan = topology, plan
        self._record("topology", {"fingerprint": topology.fingerprint(), "nodes": [n.name for n in topology.nodes]})
        self._record("plan", plan.to_json())
        for launch in self._launch(topology, plan):
            replica = self.make_replica(launch)
            self.replicas[launch.replica_id] = replica
            self.urls[launch.replica_id] = replica.start()
        return self._publish()

    def _publish(self) -> RoutingTable:
        assert self.plan is not None and self.topology is not None
        served = {p.name: p.model or p.name for p in self.plan.pools}
        gpu_of = {p.replica_id: self.topology.node(p.node).gpu(p.gpus[0]).model for p in self.plan.placements}
        self.table = table_from_plan(self.plan, self.urls, served, version=self.table.version + 1, gpu_models=gpu_of)
        self._record("routing_table", {"version": self.table.version, "replicas": len(self.table.replicas)})
        return self.table

    def check(self) -> RoutingTable:
        """One pass of the health loop: restart what died, publish if anything moved."""
        changed = False
        for rid, replica in self.replicas.items():
            if not replica.healthy():
                url = replica.ensure()
                self._record("restart", {"replica_id": rid, "url": url})
                if url != self.urls.get(rid):
                    self.urls[rid] = url
                    changed = True
        return self._publish() if changed else self.table

    def shutdown(self) -> None:
        for replica in self.replicas.values():
            replica.stop()
        self.replicas.clear()

