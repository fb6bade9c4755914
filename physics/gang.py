"""A gang's step cost as an engine sees it.

`GangCost` rides in the simulated engine's config: with it, a step of a data-parallel rank is
an MoE step of the whole gang (`physics.moecost`) and a pipeline's step runs through its stages
(`physics.pipeline`). The links come from the placement (`pools.ganglinks.gang_cost`):

    all-to-all   inside one NVLink domain: nvlink at the domain's bottleneck; across domains:
                 rdma when every rank has a NIC and every node the same rails (NIC names),
                 cross-rail otherwise or when the gang spans racks (the spine carries it), tcp
                 on a TCP fabric; each rank's NIC at its stated speed (or the fabric's)
    boundaries   each stage boundary's path, rank 0 of one stage to rank 0 of the next
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from physics import costmodel, moecost, pipeline
from physics.alltoall import GangLinks
from physics.catalog import GpuSpec, ModelSpec
from physics.costmodel import DEFAULT, Efficiency, LinkCost


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
    """One step of every sequence through the pipeline (`physics.pipeline`): the step's sequences
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
    hbm = gpu.memory_gb_s * 1e9 * eff.decode_mbu
    per_stage = []
    for stage, lk in zip(stages, links, strict=True):
        full = _forward(stage, gpu, tp, lk, chunks, decodes, decode_context, eff)
        read = stage.weights_gb * 1e9  # each micro-batch reads (and dequantises) them again
        weights = read / tp / hbm * 1e3 + costmodel.dequant_s(stage, gpu, read) / tp * 1e3
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
