"""How a re-plan becomes running replicas (pure): for each moved replica, in which order to start
its replacement and stop the old one.

Make-before-break when the new GPUs are not the old ones: the old replica is drained (no new
interactive traffic), the replacement starts, the table points at it, and the old replica stops
once idle. When the replacement needs some of the old GPUs (Ray holds each GPU for one actor,
and two engines on one GPU would not fit its memory anyway), the old replica stops first. A
replica the re-plan could not place again keeps running, drained, so batch traffic still has it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pools.model import PlacementPlan, ReplicaPlacement
from pools.placement.replan import Move

Order = Literal["make-before-break", "break-before-make", "keep-draining", "start", "retire"]
"""How a change runs: a move (make-before-break or break-before-make), a replica kept draining where
no room is left, a new replica (start), or one removed (retire: drained, stopped once idle)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Change:
    replica_id: str
    order: Order
    old: ReplicaPlacement | None
    new: ReplicaPlacement | None
    reason: str

    def to_json(self) -> dict[str, object]:
        def where(p: ReplicaPlacement | None) -> str | None:
            return None if p is None else ",".join(f"{n}:{g}" for n, g in p.gpu_refs())

        return {"replica_id": self.replica_id, "order": self.order, "from": where(self.old), "to": where(self.new),
                "reason": self.reason}


def changes(serving: Mapping[str, ReplicaPlacement], new: PlacementPlan, moves: tuple[Move, ...]) -> list[Change]:
    """`serving`: where each running replica runs now (a drained one may be in no plan)."""
    before = serving
    after = {p.replica_id: p for p in new.placements}
    out = []
    for move in moves:
        was, now = before.get(move.replica_id), after.get(move.replica_id)
        if was is None and now is None:
            continue
        if was is None:
            order: Order = "start"
        elif now is None:
            order = "keep-draining"
        elif set(was.gpu_refs()) & set(now.gpu_refs()):
            order = "break-before-make"
        else:
            order = "make-before-break"
        out.append(Change(replica_id=move.replica_id, order=order, old=was, new=now, reason=move.reason))
    return out
