"""What an expert map does to a placed gang (the simulator's view, `physics.gang`; the plan's
figures, `pools.placement.layout.finish`)."""

from __future__ import annotations

from physics import catalog
from physics.alltoall import GangLinks
from pools.experts.load import load_of
from pools.experts.metrics import Gang, LayerStats, route
from pools.experts.objective import objective
from pools.experts.policies import POLICIES
from pools.experts.policies import topology as topology_policy
from pools.model import ExpertChoice, ExpertFigures, ReplicaPlacement
from topology import Topology

__all__ = ["effect", "figures"]


def _stats(topology: Topology, placement: ReplicaPlacement, model_name: str, choice: ExpertChoice,
           links: GangLinks | None) -> tuple[Gang, list[LayerStats]]:
    model = catalog.model(model_name)
    if model.moe is None:
        raise ValueError(f"{model_name} is a dense model: no experts to place")
    if choice.policy not in POLICIES:
        raise ValueError(f"unknown expert policy {choice.policy!r} (known: {', '.join(POLICIES)})")
    gang = Gang.of(topology, placement)
    load = load_of(choice.load, model_name)
    physical = model.moe.routed_experts + choice.redundant
    step = None
    if choice.policy == "topology" and links is not None:
        gpu = catalog.gpus().get(topology.gpu(gang.gpus[0]).model or "", catalog.gpu("h100-sxm"))
        step = objective(model, gpu, links, gang.size, "prefill" if placement.role == "prefill" else "decode")
    out = []
    for k in range(len(load.layers)):
        shares = load.shares(k)
        if choice.policy == "topology":
            layer = topology_policy(shares, gang, physical, model.moe.groups, step=step, locality=choice.locality)
        else:
            layer = POLICIES[choice.policy](shares, gang, physical, model.moe.groups)
        out.append(route(shares, layer, gang, choice.locality))
    return gang, out


def effect(topology: Topology, placement: ReplicaPlacement, model_name: str, choice: ExpertChoice,
           links: GangLinks | None = None) -> tuple[float, float]:
    """What the map does to the gang's steps, over the load's layers: (max over mean GPU expert
    load, share of the pairs that leave their domain). With the gang's `links`, the topology
    policy minimises the step they price (`pools.experts.objective`), as the vLLM plugin does."""
    _, stats = _stats(topology, placement, model_name, choice, links)
    imbalance = sum(1.0 / max(s.balancedness, 1e-6) for s in stats) / len(stats)
    return imbalance, sum(s.cross_share for s in stats) / len(stats)


def figures(topology: Topology, placement: ReplicaPlacement, model_name: str, choice: ExpertChoice,
            links: GangLinks | None = None) -> ExpertFigures:
    gang, stats = _stats(topology, placement, model_name, choice, links)
    domain_load: dict[str, float] = {}
    for st in stats:
        for g, x in enumerate(st.gpu_load):
            domain_load[gang.domain[g]] = domain_load.get(gang.domain[g], 0.0) + x / len(stats)
    return ExpertFigures(policy=choice.policy, redundant=choice.redundant,
                         balancedness=len(stats) / sum(1.0 / max(s.balancedness, 1e-6) for s in stats),
                         cross_domain_share=sum(s.cross_share for s in stats) / len(stats),
                         domain_load=tuple(sorted(domain_load.items())))
