"""Re-place one replica on purpose (issue 34: its prefill -> decode pair was judged to take the
wrong path, or an operator says so): a re-plan in which that replica moves and every other one
stays (pure: plan and topology in, a `Replan` or why not out).

Where to: away from what it had. Its GPUs stay its own until the replacement serves
(make-before-break), so they are never a candidate; first choice is GPUs whose nearest NICs are
not its own (a KV transfer that took the wrong road through its NIC takes another one), and only
when no such room is left, any other free GPUs (the GPUs were the problem, or the pairing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pools.model import PlacementPlan, ReplicaPlacement
from pools.pinning import nearest_nics
from pools.placement.replan import Replan, replan
from topology import GpuRef, Topology


@dataclass(frozen=True, slots=True, kw_only=True)
class Eviction:
    replan: Replan | None
    """The re-plan that moves the replica (None: nowhere to go)."""
    why: str
    """Where it goes and why there, or why nowhere."""


def nic_neighbours(topology: Topology, placement: ReplicaPlacement) -> tuple[frozenset[GpuRef], tuple[str, ...]]:
    """The GPUs that share a nearest NIC with the placement's (its own included), and those NICs."""
    refs: set[GpuRef] = {GpuRef(n, g) for n, g in placement.gpu_refs()}
    names: list[str] = []
    by_node: dict[str, list[int]] = {}
    for n, g in placement.gpu_refs():
        by_node.setdefault(n, []).append(g)
    for name, gpus in by_node.items():
        if not topology.has_node(name):
            continue
        for nic in nearest_nics(topology.node(name), tuple(gpus)):
            names.append(f"{name}:{nic.name}")
            refs.update(GpuRef(name, g) for g in nic.nearest_gpus)
    return frozenset(refs), tuple(names)


def evict(plan: PlacementPlan, topology: Topology, replica_id: str, reason: str,
          held: Sequence[ReplicaPlacement] = ()) -> Eviction:
    """The re-plan that moves `replica_id` off its GPUs (and off its NICs where room allows);
    `held`: replicas outside the plan that still hold GPUs. ValueError: the plan has no such replica."""
    current = next((p for p in plan.placements if p.replica_id == replica_id), None)
    if current is None:
        raise ValueError(f"no replica {replica_id!r} in the plan ({', '.join(p.replica_id for p in plan.placements)})")
    own = frozenset(GpuRef(n, g) for n, g in current.gpu_refs())
    near, nics = nic_neighbours(topology, current)
    tries = [(near, f"off its GPUs and their NICs ({', '.join(nics)})")] if nics else []
    if near != own or not nics:
        tries.append((own, "off its GPUs" + (" (no room away from their NICs)" if nics else "")))
    for avoid, where in tries:
        result = replan(plan, topology, previous=topology, held=held, evict={replica_id: reason}, avoid=avoid)
        if any(p.replica_id == replica_id for p in result.plan.placements):
            return Eviction(replan=result, why=where)
    return Eviction(replan=None, why=f"no free GPUs for {replica_id} off its own")
