"""Speculative decoding (MTP, EAGLE-style draft heads): the tokens a step yields and the draft
and verify passes it costs, each a decode step of the cost model (`costmodel.DecodeStep`)."""

from __future__ import annotations

from dataclasses import replace

from physics.catalog import GpuSpec, ModelSpec
from physics.costmodel import DEFAULT, DecodeStep, Efficiency, LinkCost


def tokens_per_step(acceptance_rate: float, draft_tokens: int) -> float:
    """Tokens a speculative step yields per sequence on average (the acceptance length: the
    accepted drafts and the target's own token), when each of `draft_tokens` drafts is accepted
    with probability `acceptance_rate` given the ones before it were: (1 - a^(k+1)) / (1 - a)."""
    a = min(max(acceptance_rate, 0.0), 1.0)
    if a >= 1.0:
        return float(draft_tokens + 1)
    return (1.0 - a ** (draft_tokens + 1)) / (1.0 - a)


def decode_ms(model: ModelSpec, gpu: GpuSpec, tp: int, link: LinkCost, batch: int,
              context_tokens: int, draft_tokens: int, eff: Efficiency = DEFAULT) -> tuple[float, float]:
    """One speculative step of `batch` sequences (MTP or an EAGLE-style one-layer draft head):
    `draft_tokens` draft passes one after another, each a decode step of one decoder layer and
    the LM head, then the target verifying k + 1 tokens of every sequence in one pass (a decode
    step of batch x (k + 1) tokens reading the weights and the KV once: `context_tokens` is the
    context of the whole batch, as `decode_step_ms` takes it). Returns (draft ms,
    verify ms); TPOT is their sum over the acceptance length (`tokens_per_step`)."""
    b, k = max(batch, 1), max(draft_tokens, 0)
    verify_ms = DecodeStep.of(model, gpu, tp, link, b * (k + 1), eff).ms(context_tokens)
    head_params_b = model.head_params_b
    layer_params_b = model.body_params_b / model.layers
    drafter = replace(model, layers=1, params_b=layer_params_b + head_params_b,
                      active_params_b=layer_params_b + head_params_b, moe=None, tied_embeddings=True)
    draft_ms = k * DecodeStep.of(drafter, gpu, tp, link, b, eff).ms(context_tokens // max(model.layers, 1))
    return draft_ms, verify_ms
