"""The controller's engine ports, node by node: what running, retiring and starting replicas
hold, and what replicas found taken by processes the controller does not know. The choice itself
is pure (`pools.ports.allocate`); this keeps the books, for starts that run side by
side on worker threads (one thread at a time in the books)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from control.launch.build import next_ports, ports_taken
from control.spec import EngineLaunch
from pools.ports import EnginePorts, PortPlan, allocate


class PortBook:
    def __init__(self, plan: PortPlan, held: Callable[[], Iterable[EngineLaunch]],
                 record: Callable[[str, dict[str, Any]], None]) -> None:
        self.plan, self.held, self.record = plan, held, record
        self.busy: dict[str, set[int]] = {}
        """Ports replicas found taken on their node."""
        self.starting: dict[str, EngineLaunch] = {}
        """Actor name -> the launch being started (its ports are taken too). By actor name: a
        replica id may have a start that was superseded still running beside its newer one."""
        self.lock = threading.Lock()

    def taken(self, node: str) -> set[int]:
        return ports_taken([*self.held(), *self.starting.values()], node) | self.busy.get(node, set())

    def begin(self, launch: EngineLaunch) -> None:
        with self.lock:
            self.starting[launch.actor_name] = launch

    def end(self, actor_name: str) -> None:
        """The start is over: its ports are held by a running replica now, or by nothing."""
        with self.lock:
            self.starting.pop(actor_name, None)

    def allocate(self, node: str, side_channel: bool) -> EnginePorts:
        with self.lock:
            return allocate(self.plan, node, self.taken(node), side_channel)

    def reallocate(self, launch: EngineLaunch, busy_port: int) -> EngineLaunch:
        """Another try on other ports: `busy_port` is taken on the launch's node."""
        with self.lock:
            self.busy.setdefault(launch.node, set()).add(busy_port)
            self.record("port_in_use", {"replica_id": launch.replica_id, "node": launch.node, "port": busy_port})
            self.starting[launch.actor_name] = next_ports(self.plan, launch, self.taken(launch.node))
            return self.starting[launch.actor_name]
