"""Placement policies behind one protocol, selected by name.

    island-aligned   ours: TP groups inside islands, PD in one island, SLO-aware, no stranding
    ray-pack         Ray's default PACK: first node with room, GPUs in index order
    spread           Ray's SPREAD: a replica's GPUs on different nodes
    first-fit        first node with room, lowest indices
    random           random node with room, random GPUs (seeded)

Every policy is pure: `place(PlacementRequest) -> PlacementPlan`; infeasible replicas become
`Unplaced` values with a reason, never exceptions.

Imports `pools` (model, catalog, cost model) and `topology` only.
"""

from __future__ import annotations

from typing import Protocol

from pools.model import PlacementPlan, PlacementRequest
from pools.placement.baselines import FirstFit, RandomPolicy, RayPack, Spread
from pools.placement.island_aligned import IslandAligned


class PlacementPolicy(Protocol):
    name: str
    island_aware: bool
    """True when the policy promises in-island TP groups free of unhealthy links."""

    def place(self, request: PlacementRequest) -> PlacementPlan: ...


POLICIES: dict[str, PlacementPolicy] = {
    p.name: p for p in (IslandAligned(), RayPack(), Spread(), FirstFit(), RandomPolicy())
}


def get_policy(name: str) -> PlacementPolicy:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown placement policy {name!r} (policies: {', '.join(POLICIES)})") from None


def place(request: PlacementRequest, policy: str) -> PlacementPlan:
    return get_policy(policy).place(request)


__all__ = ["POLICIES", "PlacementPolicy", "get_policy", "place"]
