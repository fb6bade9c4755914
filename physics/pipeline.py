"""Pipeline stages in the cost model's one physics: per-stage steps plus the activation hand-off
at each stage boundary over the link that carries it, and the bubble at decode.

    stage       `costmodel.forward_ms` over the stage's share of the layers (weights, KV and
                all-reduces scale with it; the per-step constant does not)
    boundary    the hidden states of the step's tokens (T x H x 2 bytes) from each TP rank to the
                same rank of the next stage, over its own link: bytes / (line x bus efficiency)
                + the link's latency + a launch (`collectives.LAUNCH_US`)
    prefill     one prompt streamed through the stages in chunks of `chunk` tokens (chunked
                pipeline prefill, as SGLang runs long prompts on PP: stage s works on chunk j
                while stage s+1 works on chunk j-1). Chunk j attends over the j chunks before
                it, so later chunks take longer; a permutation flow shop with hand-offs:
                    finish(s, j) = max(finish(s-1, j) + boundary(j), finish(s, j-1)) + stage(s, j)
                the prompt is done at finish(last stage, last chunk). One chunk (`chunk` 0 or at
                least the prompt): the prompt passes every stage in turn, sum of stages + sum of
                boundaries (an engine that does not pipeline one prompt's chunks). The bubble is
                the share of stage time idle during the fill and drain.
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

PP_CHUNK_TOKENS = 8192
"""Default chunk of a pipelined prefill: vLLM's and SGLang's default token budget per step on
80 GB-class GPUs (vLLM `max_num_batched_tokens` for the API server, SGLang
`--chunked-prefill-size`); `cost pp --chunk` sets it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineStep:
    stage_ms: tuple[float, ...]
    boundary_ms: tuple[float, ...]
    total_ms: float
    """Prefill: the prompt's time through every stage; decode: the cycle (TPOT)."""
    micro_batches: int
    """Decode: micro-batches in flight; prefill: the prompt's chunks."""
    bubble: float
    """Share of the time a stage is idle (0..1)."""


def stage_model(model: ModelSpec, pp: int, stage: int) -> ModelSpec:
    """The share of `model` stage `stage` of `pp` holds: its layers (vLLM splits them evenly,
    the first stages taking one more when they do not divide), weights and KV in proportion; the
    LM head (and an untied embedding, a gather) on the last stage, which samples."""
    base, extra = divmod(model.layers, pp)
    layers = base + (1 if stage < extra else 0)
    share = layers / model.layers
    moe = model.moe
    if moe is not None:
        moe = replace(moe, moe_layers=max(0, round(moe.moe_layers * share)))
    ends = model.embedding_params_b + model.head_params_b if stage == pp - 1 else 0.0
    outer = model.embedding_params_b + model.head_params_b
    return replace(model, layers=layers, params_b=(model.params_b - outer) * share + ends,
                   active_params_b=(model.active_params_b - outer) * share + ends, moe=moe,
                   vocab=model.vocab if stage == pp - 1 else 0)


def boundary_ms(tokens: int, hidden: int, link: LinkCost) -> float:
    """One hand-off of `tokens` tokens' hidden states over `link` (per TP rank, in parallel)."""
    if link.bandwidth_gb_s == math.inf:
        return 0.0
    rate = max(link.bandwidth_gb_s, 0.01) * BUS_EFFICIENCY[link.hw] * 1e9
    return tokens * hidden * BF16 / rate * 1e3 + (link.latency_us + LAUNCH_US) * 1e-3


def pipeline_step(model: ModelSpec, gpu: GpuSpec, tp: int, pp: int, tp_link: LinkCost, boundaries: Sequence[LinkCost],
                  *, prefill_tokens: int = 0, decodes: int = 0, decode_context: int = 0, chunk: int = PP_CHUNK_TOKENS,
                  eff: Efficiency = DEFAULT) -> PipelineStep:
    """A prefill of `prefill_tokens` (one prompt, in chunks of `chunk`; 0: unchunked), or a
    decode cycle of `decodes` sequences of `decode_context` tokens each, over `pp` stages of
    TP=`tp` joined by `boundaries` (pp - 1)."""
    if pp < 1 or pp > model.layers:
        raise ValueError(f"pp must be 1..{model.layers} for {model.name}, got {pp}")
    if len(boundaries) != pp - 1:
        raise ValueError(f"{pp} stages need {pp - 1} boundary links, got {len(boundaries)}")
    if chunk < 0:
        raise ValueError(f"chunk must be 0 (unchunked) or more, got {chunk}")
    stages = [stage_model(model, pp, s) for s in range(pp)]
    if prefill_tokens > 0:
        return _chunked_prefill(stages, gpu, tp, tp_link, boundaries, prefill_tokens, chunk, model.hidden, eff)
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


def _chunked_prefill(stages: Sequence[ModelSpec], gpu: GpuSpec, tp: int, tp_link: LinkCost,
                     boundaries: Sequence[LinkCost], tokens: int, chunk: int, hidden: int,
                     eff: Efficiency) -> PipelineStep:
    """The flow shop of the module docstring: `stage_ms` and `boundary_ms` are each stage's and
    each boundary's total over the chunks."""
    size = tokens if chunk <= 0 else min(chunk, tokens)
    pieces = [(min(size, tokens - start), start) for start in range(0, tokens, size)]
    finish = [0.0] * len(stages)
    stage_total = [0.0] * len(stages)
    hop_total = [0.0] * len(boundaries)
    for n, before in pieces:
        ready = 0.0
        for s, stage in enumerate(stages):
            if s > 0:
                hop = boundary_ms(n, hidden, boundaries[s - 1])
                hop_total[s - 1] += hop
                ready += hop
            work = forward_ms(stage, gpu, tp, tp_link, ((n, before),), 0, 0, eff)
            stage_total[s] += work
            finish[s] = max(ready, finish[s]) + work
            ready = finish[s]
    total = finish[-1]
    busy = sum(stage_total)
    return PipelineStep(stage_ms=tuple(stage_total), boundary_ms=tuple(hop_total), total_ms=total,
                        micro_batches=len(pieces),
                        bubble=max(0.0, 1.0 - busy / (len(stages) * total)) if total > 0 else 0.0)
