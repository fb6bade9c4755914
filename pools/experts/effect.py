"""What an expert map does to a placed gang's steps (the simulator's view, `pools.gangcost`)."""

from __future__ import annotations

from dataclasses import dataclass

from pools import catalog
from pools.experts.load import load_of
from pools.experts.metrics import Gang, route
from pools.experts.policies import POLICIES
from pools.model import ReplicaPlacement
from topology import Topology


@dataclass(frozen=True, slots=True)
class ExpertChoice:
    """How a simulation maps experts: a policy, a load (`load.load_of`), redundant experts."""

    policy: str
    load: str = "zipf:1.3"
    redundant: int = 0


def effect(topology: Topology, placement: ReplicaPlacement, model_name: str, choice: ExpertChoice
           ) -> tuple[float, float]:
    """What the map does to the gang's steps, over the load's layers: (max over mean GPU expert
    load, share of the pairs that leave their domain)."""
    model = catalog.model(model_name)
    if model.moe is None:
        raise ValueError(f"{model_name} is a dense model: no experts to place")
    if choice.policy not in POLICIES:
        raise ValueError(f"unknown expert policy {choice.policy!r} (known: {', '.join(POLICIES)})")
    gang = Gang.of(topology, placement)
    load = load_of(choice.load, model_name)
    physical = model.moe.routed_experts + choice.redundant
    stats = [route(load.shares(k), POLICIES[choice.policy](load.shares(k), gang, physical, model.moe.groups), gang)
             for k in range(len(load.layers))]
    imbalance = sum(1.0 / max(s.balancedness, 1e-6) for s in stats) / len(stats)
    return imbalance, sum(s.cross_share for s in stats) / len(stats)
