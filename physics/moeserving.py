"""A closed-loop serving run of an attention-DP + expert-parallel gang under in-flight batching:
a fixed number of requests in flight per DP rank, each a prompt of `prompt` tokens and `output`
generated tokens, a finished request replaced at once by a new one (trtllm-bench `throughput
--concurrency`, fixed lengths), every rank admitting its new prompts into its own steps beside its
decodes, up to its token budget per step (`max_num_tokens`; no chunked prefill).

Two facts of such an engine set the pace:

- The ranks run in lockstep (every MoE layer's dispatch and combine wait for every rank), so "the
  iteration time is dominated by the slowest rank": a rank that runs a prompt holds up every other
  rank's decodes. TensorRT-LLM's baseline attention-DP scheduling deals arriving requests to the
  ranks in turn and each rank runs its context at once, so "contexts are processed sequentially
  across ranks", each in an iteration that lasts a context step; it "fails to guarantee
  per-iteration load balance" (tech blog 10, "ADP Balance Strategy", NVIDIA/TensorRT-LLM 011cfc2
  docs/source/blogs/tech_blog/blog10_ADP_Balance_Strategy.md; its balancing, `attention_dp_config:
  enable_balance`, is off unless configured). So with `q` the share of steps in which one rank
  runs a prompt, a share min(1, dp x q) of the gang's steps wait for one (a closed loop's arrivals
  come as its requests finish, spread over the steps).
- A step that runs a prompt on any rank runs without CUDA graphs on every rank: under attention DP
  a graph is replayed only when every rank's batch is generation-only and all batch sizes are equal
  (the ranks' `can_run_cuda_graph` all-gathered in TensorRT-LLM's tensorrt_llm/_torch/pyexecutor/
  model_engine.py `_maybe_get_cuda_graph`, mid-2025 revisions; "for the non-captured batch sizes,
  PyTorch eager mode code will be executed", tech blog 3, 01c4ece). Such a step is priced as an
  eager prefill step (`moecost.moe_forward` with chunks: the per-layer launches of a prefill).

Steady state: a request lives `output` steps (its prompt's step yields its first token), so a rank
holding `batch` requests admits batch / output new prompts a step; a step holds k prompts only if
k x prompt + (batch - k) decodes fit its token budget. A rank whose budget holds a prompt only
beside fewer decodes than `batch` keeps that many and the new one in flight; one that cannot admit
prompts as fast as they finish keeps fewer (output x the prompts it admits a step). The decode
steps read the mean context of a generation (prompt + output / 2: a step is linear in it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from physics.alltoall import GangLinks
from physics.catalog import GpuSpec, ModelSpec
from physics.costmodel import DEFAULT, LOCAL, Efficiency, LinkCost
from physics.moecost import moe_forward

TRTLLM_MAX_NUM_TOKENS = 8192
"""TensorRT-LLM's default token budget of one step (`max_num_tokens`, LLM API BuildConfig), when a
run does not state its own."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingRun:
    """What a closed-loop run's steady state looks like, per DP rank."""

    in_flight: int
    """Requests decoding on a rank (the concurrency per rank, or fewer where its token budget or
    its rate of admitting prompts holds fewer)."""
    prompts_per_step: int
    """Prompts a rank runs in a step that runs any."""
    prompt_share: float
    """Share of the gang's steps in which some rank runs a prompt (every rank waits for it)."""
    decode_ms: float
    mixed_ms: float
    step_ms: float
    tokens_per_s_per_gpu: float


def mixed_step_ms(model: ModelSpec, gpu: GpuSpec, tp: int, dp: int, links: GangLinks, prompts: int, prompt: int,
                  decodes: int, context: int, *, prompt_ranks: float = 1.0, tp_link: LinkCost = LOCAL,
                  eff: Efficiency = DEFAULT) -> float:
    """One step in which `prompt_ranks` DP ranks (on average, at least one) each run `prompts`
    prompts of `prompt` tokens beside their `decodes` decodes (each reading `context` tokens) while
    every other rank decodes: such a rank's dispatch and combine (it sends the most) and its
    per-layer launches, the experts at the gang's mean load (each GPU's experts see every rank's
    tokens), and that rank's dense part as its
    decodes' plus its prompts': the prompts' attention and GEMM work (compute-bound) runs in kernels
    of its own (TensorRT-LLM runs context and generation attention as separate kernel calls), not
    hidden under the decodes' KV-cache reads."""
    chunks = [(prompt, 0)] * prompts
    busiest = moe_forward(model, gpu, tp, dp, links, chunks, decodes, decodes * context, tp_link=tp_link, eff=eff)
    mean_tokens = max(1, round(decodes + min(float(dp), max(1.0, prompt_ranks)) * prompts * prompt / dp))
    mean = moe_forward(model, gpu, tp, dp, links, [(mean_tokens, 0)], 0, 0, tp_link=tp_link, eff=eff)
    alone = moe_forward(model, gpu, tp, dp, links, chunks, 0, 0, tp_link=tp_link, eff=eff)
    decoding = moe_forward(model, gpu, tp, dp, links, (), decodes, decodes * context, tp_link=tp_link,
                           eff=eff) if decodes > 0 else None
    dense_ms = alone.dense_ms + (decoding.dense_ms if decoding is not None else 0.0)
    return busiest.total_ms - busiest.experts_ms - busiest.dense_ms + mean.experts_ms + max(dense_ms,
                                                                                           busiest.dense_ms)


def closed_loop_run(model: ModelSpec, gpu: GpuSpec, tp: int, dp: int, links: GangLinks, batch: int, prompt: int,
                    output: int, *, max_num_tokens: int = TRTLLM_MAX_NUM_TOKENS, tp_link: LinkCost = LOCAL,
                    eff: Efficiency = DEFAULT) -> ServingRun:
    """The steady state of `batch` requests in flight on each of `dp` ranks (module docstring)."""
    if batch <= 0 or prompt <= 0 or output <= 0:
        raise ValueError("a closed-loop run needs a batch, a prompt and an output length")
    if prompt > max_num_tokens:
        raise ValueError(f"a {prompt}-token prompt exceeds the step's {max_num_tokens} tokens (no chunked prefill)")
    # a prompt fits beside at most max_num_tokens - prompt decodes: a rank holding more waits for
    # some to finish before it admits one, so it settles with that many and the new one in flight
    in_flight = min(batch, max_num_tokens - prompt + 1)
    fit = max(1, (max_num_tokens - in_flight) // (prompt - 1)) if prompt > 1 else max_num_tokens
    admitted = in_flight / output
    if admitted > fit:  # the rank admits `fit` a step at most: fewer decode at once
        admitted, in_flight = float(fit), min(in_flight, fit * output)
    k = min(fit, max(1, math.ceil(admitted)))
    share = min(1.0, dp * admitted / k)
    ranks = dp * admitted / k / share  # ranks running prompts in a step that runs any
    context = prompt + output // 2
    decode_ms = moe_forward(model, gpu, tp, dp, links, (), in_flight, in_flight * context, tp_link=tp_link,
                            eff=eff).total_ms
    mixed_ms = mixed_step_ms(model, gpu, tp, dp, links, k, prompt, max(0, in_flight - k), context,
                             prompt_ranks=ranks, tp_link=tp_link, eff=eff)
    step_ms = share * mixed_ms + (1.0 - share) * decode_ms
    return ServingRun(in_flight=in_flight, prompts_per_step=k, prompt_share=share, decode_ms=decode_ms,
                      mixed_ms=mixed_ms, step_ms=step_ms, tokens_per_s_per_gpu=in_flight / tp / (step_ms / 1e3))
