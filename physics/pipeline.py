"""Pipeline stages in the cost model's one physics: per-stage steps plus the activation hand-off
at each stage boundary over the link that carries it, and the bubble at decode.

    stage       `costmodel.forward_ms` over the stage's share of the layers (weights, KV and
                all-reduces scale with it; the per-step constant does not)
    boundary    the hidden states of the step's tokens (T x H x 2 bytes) from each TP rank to the
                same rank of the next stage, over its own link: bytes / (line x bus efficiency)
                + the link's latency + a launch (`collectives.LAUNCH_US`)
    prefill     one prompt passes every stage in turn: sum of stages + sum of boundaries
    decode      vLLM keeps up to `pp` micro-batches in flight (one per virtual engine); with m
                of them, each stage runs m micro-batch steps per cycle while a micro-batch's next
                token waits for its last one to leave the last stage:
                    cycle = max(m x slowest stage, sum of stages + sum of boundaries)
                TPOT is the cycle; the bubble is the share of the cycle a stage sits idle.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from physics.catalog import GpuSpec, ModelSpec
from physics.collectives import BUS_EFFICIENCY, LAUNCH_US
from physics.costmodel import BF16, DEFAULT, Efficiency, LinkCost, forward_ms


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineStep:
    stage_ms: tuple[float, ...]
    boundary_ms: tuple[float, ...]
    total_ms: float
    """Prefill: the prompt's time through every stage; decode: the cycle (TPOT)."""
    micro_batches: int
    bubble: float
    """Share of the time a stage is idle (0..1)."""


def stage_model(model: ModelSpec, pp: int, stage: int) -> ModelSpec:
    """The share of `model` stage `stage` of `pp` holds: its layers (vLLM splits them evenly,
    the first stages taking one more when they do not divide), weights and KV in proportion."""
    base, extra = divmod(model.layers, pp)
    layers = base + (1 if stage < extra else 0)
    share = layers / model.layers
    moe = model.moe
    if moe is not None:
        moe = replace(moe, moe_layers=max(0, round(moe.moe_layers * share)))
    return replace(model, layers=layers, params_b=model.params_b * share,
                   active_params_b=model.active_params_b * share, moe=moe)


def boundary_ms(tokens: int, hidden: int, link: LinkCost) -> float:
    """One hand-off of `tokens` tokens' hidden states over `link` (per TP rank, in parallel)."""
    if link.bandwidth_gb_s == math.inf:
        return 0.0
    rate = max(link.bandwidth_gb_s, 0.01) * BUS_EFFICIENCY[link.hw] * 1e9
    return tokens * hidden * BF16 / rate * 1e3 + (link.latency_us + LAUNCH_US) * 1e-3


def pipeline_step(model: ModelSpec, gpu: GpuSpec, tp: int, pp: int, tp_link: LinkCost, boundaries: Sequence[LinkCost],
                  *, prefill_tokens: int = 0, decodes: int = 0, decode_context: int = 0,
                  eff: Efficiency = DEFAULT) -> PipelineStep:
    """A prefill of `prefill_tokens` (one prompt), or a decode cycle of `decodes` sequences of
    `decode_context` tokens each, over `pp` stages of TP=`tp` joined by `boundaries` (pp - 1)."""
    if pp < 1 or pp > model.layers:
        raise ValueError(f"pp must be 1..{model.layers} for {model.name}, got {pp}")
    if len(boundaries) != pp - 1:
        raise ValueError(f"{pp} stages need {pp - 1} boundary links, got {len(boundaries)}")
    stages = [stage_model(model, pp, s) for s in range(pp)]
    if prefill_tokens > 0:
        times = tuple(forward_ms(m, gpu, tp, tp_link, ((prefill_tokens, 0),), 0, 0, eff) for m in stages)
        hops = tuple(boundary_ms(prefill_tokens, model.hidden, b) for b in boundaries)
        total = sum(times) + sum(hops)
        return PipelineStep(stage_ms=times, boundary_ms=hops, total_ms=total, micro_batches=1,
                            bubble=1.0 - sum(times) / (pp * total) if total > 0 else 0.0)
    if decodes <= 0:
        raise ValueError("give prefill_tokens or decodes")
    m = min(pp, decodes)
    per = math.ceil(decodes / m)
    times = tuple(forward_ms(s, gpu, tp, tp_link, (), per, per * decode_context, eff) for s in stages)
    hops = tuple(boundary_ms(per, model.hidden, b) for b in boundaries)
    cycle = max(m * max(times), sum(times) + sum(hops))
    busy = m * sum(times) / pp
    return PipelineStep(stage_ms=times, boundary_ms=hops, total_ms=cycle, micro_batches=m,
                        bubble=max(0.0, 1.0 - busy / cycle) if cycle > 0 else 0.0)
