"""A gang's step cost as an engine sees it, and the links a placed gang's traffic takes.

`GangCost` rides in the simulated engine's config: with it, a step of a data-parallel rank is
an MoE step of the whole gang (`pools.moecost`) and a pipeline's step runs through its stages
(`pools.pipeline`). `gang_cost(topology, plan, placement)` reads the links from the placement:

    all-to-all   inside one NVLink domain: nvlink at the domain's bottleneck; across domains:
                 rdma when every rank has a NIC and every node the same rails (NIC names),
                 cross-rail otherwise or when the gang spans racks (the spine carries it), tcp
                 on a TCP fabric; each rank's NIC at its stated speed (or the fabric's)
    boundaries   each stage boundary's path, rank 0 of one stage to rank 0 of the next
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from pools import costmodel, moecost, pipeline
from pools.catalog import GpuSpec, ModelSpec
from pools.costmodel import DEFAULT, LOCAL, Efficiency, LinkCost
from pools.model import PlacementPlan, ReplicaPlacement
from pools.moecost import Carrier, GangLinks
from topology import GpuRef, LinkKind, Topology, bottleneck, islands, path
from topology.islands import island_of

if TYPE_CHECKING:
    from pools.model import ExpertChoice


@dataclass(frozen=True, slots=True, kw_only=True)
class GangCost:
    dp: int = 1
    pp: int = 1
    expert_parallel: bool = False
    links: GangLinks | None = None
    """The all-to-all's links (expert-parallel gangs)."""
    boundaries: tuple[LinkCost, ...] = ()
    """One per pipeline stage boundary."""
    stage_links: tuple[LinkCost, ...] = ()
    """Each pipeline stage's TP group link (its bottleneck); empty: the engine's own link for all."""
    overlap: bool = False
    imbalance: float | None = None


def gang_forward_ms(model: ModelSpec, gpu: GpuSpec, tp: int, link: LinkCost, gang: GangCost,
               chunks: Sequence[tuple[int, int]], decodes: int, decode_context: int,
               eff: Efficiency = DEFAULT) -> float:
    """One engine step of a rank of the gang (`costmodel.forward_ms`'s contract)."""
    if gang.pp > 1:
        return _pipeline_ms(model, gpu, tp, link, gang, chunks, decodes, decode_context, eff)
    if model.moe is not None and gang.links is not None:
        return moecost.moe_forward(model, gpu, tp, gang.dp, gang.links, chunks, decodes, decode_context,
                                   tp_link=link, imbalance=gang.imbalance, overlap=gang.overlap,
                                   expert_parallel=gang.expert_parallel, eff=eff).total_ms
    return _forward(model, gpu, tp, link, chunks, decodes, decode_context, eff)


def _forward(model: ModelSpec, gpu: GpuSpec, tp: int, link: LinkCost, chunks: Sequence[tuple[int, int]],
             decodes: int, decode_context: int, eff: Efficiency) -> float:
    return costmodel.forward_ms(model, gpu, tp, link, chunks, decodes, decode_context, eff)


def _pipeline_ms(model: ModelSpec, gpu: GpuSpec, tp: int, link: LinkCost, gang: GangCost,
                 chunks: Sequence[tuple[int, int]], decodes: int, decode_context: int, eff: Efficiency) -> float:
    """One step of every sequence through the pipeline (`pools.pipeline`): the step's sequences
    go as m = min(pp, sequences) micro-batches, each stage reading its weights once per
    micro-batch and sharing the rest of its work among them; a sequence's next token waits for
    its micro-batch to pass every stage, and each stage serves every micro-batch per cycle:
        cycle = max(m x slowest micro-batch stage, sum of micro-batch stages + boundaries)
    (one prompt alone, m = 1: it passes the stages in turn)."""
    stages = [pipeline.stage_model(model, gang.pp, s) for s in range(gang.pp)]
    links = gang.stage_links if len(gang.stage_links) == gang.pp else (link,) * gang.pp
    sequences = len(chunks) + decodes
    m = max(1, min(gang.pp, sequences))
    tokens = sum(n for n, _ in chunks) + decodes
    hbm = gpu.hbm_gb_s * 1e9 * eff.decode_mbu
    per_stage = []
    for stage, lk in zip(stages, links, strict=True):
        full = _forward(stage, gpu, tp, lk, chunks, decodes, decode_context, eff)
        weights = stage.weights_gb * 1e9 / tp / hbm * 1e3
        per_stage.append(min(full, weights) + max(full - weights, 0.0) / m)
    hops = sum(pipeline.boundary_ms(-(-tokens // m), model.hidden, b) for b in gang.boundaries)
    return max(m * max(per_stage), sum(per_stage) + hops)


class GangDecode:
    """A pure decode step of a fixed batch as a function of the context (the fast-forward's view)."""

    __slots__ = ("_args", "_moe")

    def __init__(self, model: ModelSpec, gpu: GpuSpec, tp: int, link: LinkCost, gang: GangCost, batch: int,
                 eff: Efficiency) -> None:
        self._args = (model, gpu, tp, link, gang, batch, eff)
        self._moe = moecost.moe_decode(model, gpu, tp, gang.dp, gang.links, batch, link, gang.imbalance,
                                       gang.overlap, gang.expert_parallel, eff) \
            if model.moe is not None and gang.links is not None and gang.pp == 1 else None

    def ms(self, context_tokens: int) -> float:
        if self._moe is not None:
            return self._moe.ms(context_tokens)
        model, gpu, tp, link, gang, batch, eff = self._args
        return gang_forward_ms(model, gpu, tp, link, gang, (), batch, context_tokens, eff)


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
                     nic_gb_s=nic, nic_latency_us=fabric.latency_us)


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
        from pools.experts.effect import effect

        imbalance, cross = effect(topology, p, pool.model, experts)
        if links.carrier != "nvlink":
            links = replace(links, outside_share=cross)
    return GangCost(dp=pool.dp, pp=pool.pp, expert_parallel=pool.expert_parallel, links=links, imbalance=imbalance,
                    boundaries=boundary_links(topology, p) if pool.pp > 1 else (),
                    stage_links=stage_links(topology, p, pool.tp) if pool.pp > 1 else (), overlap=overlap)
