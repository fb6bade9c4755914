"""The Ray actors: a detached, named controller and one detached, named replica actor per
placement (detached so that they outlive a controller restart, which reattaches to them by name).

A replica actor is pinned to its planned node (node affinity) and holds one unit of each of its
planned GPUs' `isle_gpu_<node>_<i>` resources, so Ray's accounting matches the plan.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from control.backend import Discovery, Replica, engine_for
from control.benches.schedule import Subject
from control.benches.tasks import bench_on_ray
from control.controller import CONTROLLER_NAME, NAMESPACE, ControllerCore
from control.discovery import discover_cluster, ray_nodes
from control.nodecheck import RayNode
from control.spec import ControllerSpec, EngineLaunch
from control.state import saved as state
from pools.nodelabels import PREFIX
from pools.routing import RoutingTable
from topology import Topology
from topology.bench.record import BenchRecord
from topology.bench.run import BenchSettings

HEALTH_INTERVAL_S = 2.0
log = logging.getLogger("isleserve.controller")
CALL_TIMEOUT_S = 30.0
PLACE_TIMEOUT_S = 180.0
"""How long Ray may take to place a replica's actor on its node and start the worker process it
runs in: seconds alone; CI's two loaded cores, three raylets on them, have taken over a minute."""
HEAD_RESOURCE = "node:__internal_head__"
"""The resource only Ray's head node has."""
STOP_TIMEOUT_S = 60.0
"""A vLLM server gets 20 s after SIGTERM before the launcher kills its process group."""


class _ReplicaActor:
    def __init__(self, launch: EngineLaunch) -> None:
        # the actor runs its methods on its main thread: the vLLM server may follow it (a replica
        # actor killed outright must not leave a server holding its GPUs and ports)
        self.process = engine_for(launch, str(ray.util.get_node_ip_address()),  # type: ignore[no-untyped-call]
                                  die_with_starter=True)

    def start(self) -> str:
        return self.process.start()

    def healthy(self) -> bool:
        return self.process.healthy()

    def idle(self) -> bool:
        return self.process.idle()

    def ensure(self) -> str:
        return self.process.ensure()

    def stop(self) -> None:
        self.process.stop()

    def info(self) -> dict[str, Any]:
        ctx: Any = ray.get_runtime_context()
        labels = {k: v for k, v in ctx.get_node_labels().items() if k.startswith(PREFIX)}
        return {**self.process.info(), "actor": ctx.get_actor_name(), "ray_node_id": ctx.get_node_id(),
                "ray_node_labels": labels, "ray_resources": ctx.get_assigned_resources(), "actor_pid": os.getpid()}


_remote: Any = ray.remote  # Ray's overloads do not type a class decorated with options
ReplicaActor: Any = _remote(num_cpus=0)(_ReplicaActor)


class RemoteReplica:
    """The controller's view of a replica actor (the Replica protocol, over ray.get)."""

    def __init__(self, actor: Any, launch: EngineLaunch) -> None:
        self.actor, self.launch = actor, launch

    @classmethod
    def create(cls, launch: EngineLaunch) -> RemoteReplica:
        pin = launch.pin
        options: dict[str, Any] = {"name": launch.actor_name, "namespace": NAMESPACE, "lifetime": "detached",
                                   "resources": dict(pin.resources)}
        if pin.ray_node_id is not None:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(pin.ray_node_id, soft=False)
        return cls(ReplicaActor.options(**options).remote(launch), launch)

    def _call(self, method: str, timeout_s: float = CALL_TIMEOUT_S) -> Any:
        return ray.get(getattr(self.actor, method).remote(), timeout=timeout_s)

    def start(self) -> str:
        try:  # first Ray places the actor where its GPUs are, then the actor starts the engine
            ray.get(self.actor.__ray_ready__.remote(), timeout=PLACE_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(f"replica {self.launch.replica_id}: Ray did not start its actor within "
                               f"{PLACE_TIMEOUT_S:g} s; does Ray node {self.launch.pin.ray_node_id} have free "
                               f"{sorted(self.launch.pin.resources)}?") from None
        timeout_s = self.launch.ready_timeout_s + CALL_TIMEOUT_S
        try:
            return str(self._call("start", timeout_s))
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(f"replica {self.launch.replica_id}: its engine was not running after {timeout_s:g} s"
                               ) from None

    def healthy(self) -> bool:
        return bool(self._call("healthy"))

    def idle(self) -> bool:
        return bool(self._call("idle"))

    def ensure(self) -> str:
        return str(self._call("ensure", self.launch.ready_timeout_s + CALL_TIMEOUT_S))

    def stop(self) -> None:
        try:
            self._call("stop", STOP_TIMEOUT_S)
        finally:
            ray.kill(self.actor, no_restart=True)

    def info(self) -> dict[str, Any]:
        return dict(self._call("info"))


def _wait_name_free(name: str, timeout_s: float = 15.0) -> None:
    """Ray frees a killed actor's name a moment later: a replica started again under the same name
    (other ports, same generation) waits for it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            return
        time.sleep(0.2)


class RayBackend:
    def session(self) -> str:
        return str(ray.get_runtime_context().get_session_name())

    def discover(self, source: str) -> Discovery:
        return discover_cluster(source)

    def nodes(self) -> list[RayNode] | None:
        return ray_nodes()

    def create(self, launch: EngineLaunch) -> Replica:
        _wait_name_free(launch.actor_name)
        return RemoteReplica.create(launch)

    def attach(self, launch: EngineLaunch) -> Replica | None:
        try:
            actor = ray.get_actor(launch.actor_name, namespace=NAMESPACE)
        except ValueError:
            return None
        return RemoteReplica(actor, launch)

    def bench(self, topology: Topology, due: Sequence[Subject], settings: BenchSettings, source: str
              ) -> dict[str, BenchRecord | str]:
        return bench_on_ray(topology, due, settings, source)


class _ControllerActor:
    def __init__(self, spec: ControllerSpec) -> None:
        self.core = ControllerCore(spec, RayBackend())
        self.core.host_names = frozenset({str(ray.util.get_node_ip_address()),  # type: ignore[no-untyped-call]
                                          socket.gethostname()})
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.loop: threading.Thread | None = None
        if state.resumable(spec.state_dir, self.core.backend.session(), state.digest(spec)):
            self.deploy()  # restarted by Ray: reattach to the replicas the last incarnation started

    def spec_digest(self) -> str:
        return state.digest(self.core.spec)

    def deploy(self) -> RoutingTable:
        with self.lock:
            if self.core.table.version == 0:
                self.core.deploy()
                self.loop = threading.Thread(target=self._health_loop, name="isleserve-health", daemon=True)
                self.loop.start()
            return self.core.table

    def _health_loop(self) -> None:
        """A pass every HEALTH_INTERVAL_S, and between passes the starts that end are installed
        at once. The lock is held only while the core changes state: the starts themselves run
        on the core's worker threads, so mark_link, node loss and other restarts never wait for
        an engine that takes minutes to load."""
        due = time.monotonic() + HEALTH_INTERVAL_S
        while not self.stopping.is_set():
            self.core.fleet.starts.finished.wait(max(0.0, due - time.monotonic()))
            if self.stopping.is_set():
                return
            with self.lock:
                try:
                    if time.monotonic() < due:
                        self.core.settle()
                        continue
                    due = time.monotonic() + HEALTH_INTERVAL_S
                    self.core.check()
                except Exception:  # one bad pass must not end the loop
                    log.exception("health loop")

    def mark_link(self, node: str, a: int, b: int, healthy: bool = False, reason: str = "") -> list[dict[str, Any]]:
        with self.lock:
            return self.core.mark_link(node, a, b, healthy, reason)

    def replace_replica(self, replica_id: str, reason: str = "") -> list[dict[str, Any]]:
        with self.lock:
            return self.core.replace_replica(replica_id, reason)

    def table(self) -> RoutingTable:
        return self.core.table

    def observe(self, report: dict[str, Any]) -> dict[str, Any]:
        """A router's load report (every second) for the autoscaler; its status back. Not under
        the controller's lock: a health pass stopping replicas must not hold up the routers."""
        return self.core.observe(report)

    def engine_api_key(self) -> str:
        """What the engines' API wants (vLLM's --api-key), for the router: asked over Ray, so only
        by a holder of the cluster's token."""
        return self.core.engine_api_key

    def plan(self) -> dict[str, Any] | None:
        """The placement plan's JSON, with the controller's own view under `controller`."""
        if self.core.plan is None:
            return None
        return {**self.core.plan.to_json(), "controller": self.core.status()}

    def topology(self) -> Any:
        return self.core.topology

    def replicas(self) -> dict[str, dict[str, Any]]:
        """Each running replica's info (node, GPUs, the environment its engine got)."""
        return {rid: r.replica.info() for rid, r in list(self.core.running.items())}

    def shutdown(self) -> None:
        """Stops the loop, every replica and every start in flight (what one still starts is stopped)."""
        self.stopping.set()
        self.core.fleet.starts.finished.set()  # the loop wakes and ends
        with self.lock:
            self.core.shutdown()


ControllerActor: Any = _remote(num_cpus=0, max_concurrency=4, max_restarts=-1)(_ControllerActor)


def get_or_create_controller(spec: ControllerSpec) -> Any:
    """The detached controller, on the head node (as Ray Train keeps its state actor): an actor
    that needs no resources otherwise lands on any node, and a lost GPU node would take the health
    loop with it. One left by a deployment with other settings is replaced."""
    options = {"name": CONTROLLER_NAME, "namespace": NAMESPACE, "lifetime": "detached", "get_if_exists": True,
               "resources": {HEAD_RESOURCE: 0.001}}
    actor = ControllerActor.options(**options).remote(spec)
    if ray.get(actor.spec_digest.remote()) == state.digest(spec):
        return actor
    ray.get(actor.shutdown.remote())
    ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            ray.get_actor(CONTROLLER_NAME, namespace=NAMESPACE)
        except ValueError:
            break
        time.sleep(0.2)
    return ControllerActor.options(**options).remote(spec)
