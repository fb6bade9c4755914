"""What an expert map does to a placed gang (the simulator's view, `pools.gangcost`; the plan's
figures, `pools.placement.common.finish`)."""

from __future__ import annotations

from pools import catalog
from pools.experts.load import load_of
from pools.experts.metrics import Gang, route
from pools.experts.policies import POLICIES
from pools.model import ExpertChoice, ExpertFigures, ReplicaPlacement
from topology import Topology

__all__ = ["ExpertChoice", "effect", "figures"]


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


def figures(topology: Topology, placement: ReplicaPlacement, model_name: str, choice: ExpertChoice) -> ExpertFigures:
    imbalance, cross = effect(topology, placement, model_name, choice)
    return ExpertFigures(policy=choice.policy, redundant=choice.redundant, balancedness=1.0 / imbalance,
                         cross_domain_share=cross)
