"""The replicas the controller runs: those serving (by replica id), the old ones of
make-before-break moves being retired, and the starts in flight (control.starts, on
worker threads); how a dead replica is restarted, how a start's result is installed (under the
controller's lock, when the start has ended), and how an old replica stops once idle.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from control.backend import Backend, Replica
from control.envcheck import transport_events
from control.launch import gang
from control.launch.build import Started
from control.launch.portbook import PortBook
from control.spec import EngineLaunch
from control.starts import Intent, Outcome, Restarted, Starts
from pools.model import ReplicaPlacement
from pools.placement.rollout import Change
from pools.ports import EnginePorts, PortPlan

log = logging.getLogger("isleserve.controller")
Launch = Callable[[ReplicaPlacement, int, EnginePorts | None], EngineLaunch]


@dataclass(slots=True)
class Running:
    replica: Replica
    launch: EngineLaunch
    placement: ReplicaPlacement
    url: str
    draining: bool = False
    retire_by: float = 0.0
    idle_from: float = 0.0
    """Retiring: not taken for idle before this (the routers may still be sending it one)."""
    transport_env: tuple[dict[str, Any], ...] = ()
    """Its engine's environment against the plan at its start (`control.envcheck`): the mismatches."""


class Fleet:
    def __init__(self, backend: Backend, ports: PortPlan, record: Callable[[str, dict[str, Any]], None],
                 clock: Callable[[], float], *, drain_timeout_s: float, engine: str) -> None:
        self.record, self.clock, self.drain_timeout_s, self.engine = record, clock, drain_timeout_s, engine
        self.running: dict[str, Running] = {}
        self.retiring: list[Running] = []
        self.generations: dict[str, int] = {}
        """Replica id -> the last generation handed out (a start in flight has its own: no two
        actors share a name)."""
        self.ports = PortBook(ports, self.held, record)
        self.starts = Starts(backend, self.ports, record)

    def held(self) -> list[EngineLaunch]:
        """What running and retiring replicas hold (read by starts on worker threads too: the
        tuple is built in one step, under the GIL)."""
        return [r.launch for r in (*self.running.values(), *self.retiring)]

    def generation(self, rid: str) -> int:
        self.generations[rid] = self.generations.get(rid, -1) + 1
        return self.generations[rid]

    def started(self, p: ReplicaPlacement, done: Started) -> Running:
        """A start's result, recorded (with its engine's environment checked against the plan:
        `control.envcheck`) before the caller installs and publishes it."""
        launch = done.launch
        self.record("replica_started", {"replica_id": p.replica_id, "generation": launch.generation, "url": done.url,
                                        "node": p.node, "gpus": list(p.gpus), "ray_node": launch.pin.ray_node_id,
                                        "resources": dict(launch.pin.resources), "env": dict(launch.pin.env),
                                        "engine": self.engine, "notes": list(launch.pin.notes),
                                        "ports": launch.vllm.ports.to_json() if launch.vllm else None,
                                        **({"ranks": gang.urls_of(p.replica_id, done.replica, done.url)}
                                           if launch.ranks else {})})
        mismatches = tuple(transport_events(launch, done.env))
        for event in mismatches:
            self.record("transport_env", event)
        return Running(replica=done.replica, launch=launch, placement=p, url=done.url, transport_env=mismatches)

    @staticmethod
    def stop(replica: Replica) -> None:
        try:
            replica.stop()
        except Exception as err:  # an actor on a lost node is already gone
            log.info("stopping a replica: %s", err)

    def restart_dead(self, lost: set[str], launch: Launch) -> bool:
        """Submit a restart for each replica that does not answer (not one on a lost node, nor
        one already being started); `launch` builds the new actor's launch, should it need one
        (a gang: always, it restarts whole). True when any was submitted."""
        submitted = False
        for rid, r in list(self.running.items()):
            on_lost = any(n in lost for n, _ in r.placement.gpu_refs())  # a gang: any of its nodes
            if on_lost or rid in self.starts.flight or self.healthy(r.replica):
                continue
            ports = r.launch.vllm.ports if r.launch.vllm else None  # the ones it had (others if still held)
            self.starts.restart(r.replica, launch(r.placement, self.generation(rid), ports), r.placement)
            submitted = True
        return submitted

    @staticmethod
    def healthy(replica: Replica) -> bool:
        try:
            return replica.healthy()
        except Exception:
            return False

    def settle(self) -> bool:
        """Install the starts that ended; True when the table must be published again."""
        return self.starts.settle(self._install)

    def _install(self, i: Intent, out: Outcome) -> bool:
        rid, running = i.replica_id, self.running.get(i.replica_id)
        if isinstance(out, Exception):
            if isinstance(out, gang.GangFailed):
                self.record("gang_failed", {**out.to_json(), "start": i.kind, "generation": i.launch.generation})
            if i.change is not None:
                self.record("move", {**i.change.to_json(), "result": f"replacement failed to start: {out}"})
            else:  # a restart is tried again by the next pass (the dead replica is still listed)
                self.record("restart_failed", {"replica_id": rid, "error": str(out)})
            return False
        if isinstance(out, Restarted):  # the same actor: the generation it was given is not used
            if self.generations.get(rid) == i.launch.generation:
                self.generations[rid] -= 1
            self.record("restart", {"replica_id": rid, "url": out.url})
            if running is None or running.url == out.url:
                return False
            running.url = out.url
            return True
        new = self.started(i.placement, out)
        self.running.pop(rid, None)
        if i.change is not None and running is not None:  # make-before-break: the old one drains off
            running.retire_by = self.clock() + self.drain_timeout_s
            self.retiring.append(running)
        elif i.change is None:  # a restart (its dead predecessor was stopped) or a resumed replica
            new.draining = running.draining if running is not None else i.draining
        self.running[rid] = new
        if i.change is not None:
            self.record("move", {**i.change.to_json(), "result": "replacement serving", "url": new.url})
        return True

    def retire(self) -> bool:
        """Stop the old replicas that are idle or past their drain timeout; True when any stopped."""
        keep = []
        for r in self.retiring:
            if self.clock() < r.idle_from and self.clock() < r.retire_by:
                keep.append(r)
                continue
            try:
                idle = r.replica.idle()
            except Exception:
                idle = True
            if idle or self.clock() >= r.retire_by:
                self.stop(r.replica)
                self.record("stopped", {"replica_id": r.placement.replica_id, "generation": r.launch.generation,
                                        "idle": idle})
            else:
                keep.append(r)
        stopped, self.retiring = len(keep) != len(self.retiring), keep
        return stopped

    def submit(self, c: Change, launch: Launch, retire_timeout_s: float, idle_grace_s: float) -> None:
        """Carry out one change of a new plan (`ControllerCore.apply`). A start still in flight for
        the replica is dropped, never installed over this newer decision; a replacement or a new
        replica is installed by a later pass, once it is up; a retired replica leaves the serving
        set at once, is not taken for idle for `idle_grace_s` (routers may still send it what they
        had chosen it for) and stops once idle or after `retire_timeout_s`."""
        self.starts.drop(c.replica_id, c.reason if c.order == "retire" else f"superseded: {c.reason}")
        if c.order == "retire":
            r = self.running.pop(c.replica_id, None)
            if r is not None:
                now = self.clock()
                r.draining, r.idle_from = True, now + idle_grace_s
                r.retire_by = now + retire_timeout_s
                self.retiring.append(r)
            return
        old = self.running.get(c.replica_id)
        if c.order == "keep-draining" or c.new is None:
            self.record("move", {**c.to_json(), "result": "no room: kept running, drained"})
            return
        stop_first = None  # the GPUs of the one serving decide, not only those of one being started
        shared = old is not None and set(old.placement.gpu_refs()) & set(c.new.gpu_refs())
        if old is not None and (c.order == "break-before-make" or shared):
            self.running.pop(c.replica_id)
            stop_first = old.replica
        self.starts.move(c, launch(c.new, self.generation(c.replica_id), None), stop_first)

    def stop_all(self) -> None:
        """Every replica, those being started included."""
        self.starts.close()
        for r in [*self.running.values(), *self.retiring]:
            self.stop(r.replica)
        self.running.clear()
        self.retiring.clear()
