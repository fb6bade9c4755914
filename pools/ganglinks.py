"""The links a placed gang's traffic takes, and so its step cost (`physics.gang.GangCost`):

    all-to-all   inside one NVLink domain: nvlink at the domain's bottleneck; across domains:
                 rdma when every rank has a NIC and every node the same rails (NIC names),
                 cross-rail otherwise or when the gang spans racks (the spine carries it), tcp
                 on a TCP fabric; each rank's NIC at its stated speed (or the fabric's)
    boundaries   each stage boundary's path, rank 0 of one stage to rank 0 of the next
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from physics.alltoall import Carrier, GangLinks, gpu_initiated
from physics.costmodel import LOCAL, LinkCost
from physics.gang import GangCost
from pools.experts.effect import effect
from pools.model import ExpertChoice, PlacementPlan, ReplicaPlacement
from topology import GpuRef, LinkKind, Topology, bottleneck, islands, path
from topology.islands import island_of


def gang_links(topology: Topology, p: ReplicaPlacement) -> GangLinks:
    """Where this gang's all-to-all runs (module docstring)."""
    refs = [GpuRef(n, g) for n, g in p.gpu_refs()]
    where = island_of(islands(topology))
    first = where[refs[0]]
    per_domain: dict[str, int] = {}
    for r in refs:
        per_domain[where[r].id] = per_domain.get(where[r].id, 0) + 1
    nvlink = first.bottleneck_gb_s if first.size > 1 else 0.0
    if len(per_domain) == 1:
        return GangLinks(carrier="nvlink", domain_ranks=len(refs), nvlink_gb_s=max(nvlink, 1.0))
    fabric = topology.fabric
    nics = [_nic_gb_s(topology, m.node, m.nic) for m in p.members]
    nic = min((n for n in nics if n is not None), default=fabric.nic_bandwidth_gb_s)
    racks = {topology.node(m.node).rack for m in p.members}
    rails = {tuple(sorted(n.name for n in topology.node(m.node).nics)) for m in p.members}
    carrier: Carrier
    if fabric.kind is LinkKind.TCP:
        carrier = "tcp"
    elif any(m.nic is None for m in p.members) or len(rails) > 1 or len(racks) > 1:
        carrier = "cross-rail"
    else:
        carrier = "rdma"
    return GangLinks(carrier=carrier, domain_ranks=min(per_domain.values()), nvlink_gb_s=max(nvlink, 1.0),
                     nic_gb_s=nic, nic_latency_us=fabric.latency_us,
                     gpu_initiated=gpu_initiated(fabric.technology))


def _nic_gb_s(topology: Topology, node: str, name: str | None) -> float | None:
    if name is None:
        return None
    nic = next((n for n in topology.node(node).nics if n.name == name), None)
    return nic.speed_gbit_s / 8 if nic is not None and nic.speed_gbit_s else None


def stage_links(topology: Topology, p: ReplicaPlacement, tp: int) -> tuple[LinkCost, ...]:
    """Each stage's TP group bottleneck (DP rank 0 of the stage)."""
    groups: dict[int, list[GpuRef]] = {}
    for m in p.members:
        if m.dp_rank_start == 0:
            groups.setdefault(m.pp_stage, []).extend(GpuRef(m.node, g) for g in m.gpus)
    return tuple(LOCAL if tp <= 1 or len(groups[s]) <= 1 else LinkCost.of(bottleneck(topology, groups[s]))
                 for s in sorted(groups))


def boundary_links(topology: Topology, p: ReplicaPlacement) -> tuple[LinkCost, ...]:
    """Each stage boundary's link: the path from stage s's first GPU to stage s+1's."""
    firsts: dict[int, GpuRef] = {}
    for m in p.members:
        firsts.setdefault(m.pp_stage, GpuRef(m.node, m.gpus[0]))
    stages = [firsts[s] for s in sorted(firsts)]
    out = []
    for a, b in itertools.pairwise(stages):
        hop = path(topology, a, b)
        out.append(LOCAL if hop.tier == "local" else LinkCost.of(hop))
    return tuple(out)


def gang_cost(topology: Topology, plan: PlacementPlan, p: ReplicaPlacement, overlap: bool = False,
              experts: ExpertChoice | None = None) -> GangCost | None:
    """The engine-side cost of a placed gang; None for an ordinary replica. With `experts`, an EP
    gang's expert map sets its load imbalance and the share of its all-to-all that leaves each
    domain (`pools.experts`); without, experts spread uniformly."""
    pool = plan.pool(p.pool)
    if not pool.is_gang or not p.members:
        return None
    links = gang_links(topology, p) if pool.expert_parallel else None
    imbalance = None
    if experts is not None and links is not None and pool.model is not None:
        imbalance, cross = effect(topology, p, pool.model, experts, links)
        if links.carrier != "nvlink":
            links = replace(links, outside_share=cross)
    return GangCost(dp=pool.dp, pp=pool.pp, expert_parallel=pool.expert_parallel, links=links, imbalance=imbalance,
                    boundaries=boundary_links(topology, p) if pool.pp > 1 else (),
                    stage_links=stage_links(topology, p, pool.tp) if pool.pp > 1 else (), overlap=overlap)
