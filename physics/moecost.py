"""Mixture-of-experts steps on an expert-parallel gang, in the cost model's one physics.

A step of a data-parallel-attention + expert-parallel gang (vLLM `--data-parallel-size D
--enable-expert-parallel`, EP = tp x dp): every DP rank runs attention and the dense part (the
shared expert, the dense layers, the embeddings) on its own tokens; every MoE layer then
dispatches each token to its experts, runs the expert GEMMs, and combines the results back:

    dense      roof(2 P_dense T / (tp F mfu) + attention FLOPs / (tp F_bf16 mfu),
                    (W_dense / tp + KV read) / (HBM mbu))                   (as `costmodel`)
    experts    per MoE layer, the busiest GPU's share: roof(2 x 3 H F_e x pairs x imbalance / (F mfu),
               experts it holds that some token picked x 3 H F_e bytes / (HBM mbu))
               (roof: a kernel's compute and memory times through the roofline's corner,
               `costmodel.roofline_s`, not their max)
    dispatch,  per MoE layer each: `alltoall.a2a_us` over the gang's links (DeepEP's kernels: the
    combine    high-throughput ones at prefill, the low-latency ones at decode)
    step       dense + all-reduces + MoE layers x (dispatch + experts + combine) + per-step constant
               (with two-batch overlap, `overlap`: `OVERLAP_EFFICIENCY` of the shorter of compute
               and all-to-all hides under the other)

The ranks run in lockstep (every MoE layer is a barrier), so the busiest GPU sets the pace: the
expert load's `imbalance` (max over mean GPU load) is what an expert placement changes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from physics.alltoall import DISPATCH_BYTES, GangLinks, a2a_parts, default_dispatch
from physics.catalog import GpuSpec, ModelSpec
from physics.costmodel import (
    BF16,
    DEFAULT,
    LOCAL,
    Efficiency,
    LinkCost,
    allreduce_ms,
    expected_experts,
    kv_shards,
    replicated_ms,
    roofline_s,
)
from physics.flops import MLA_ROPE_DIM, attention_flops, attention_s

MLA_Q_LORA_RANK = 1536
"""DeepSeek-V3's query compression (config.json q_lora_rank): the query's down projection is
hidden x 1536, its up projection 1536 x heads x 192."""
FP4_ATTENTION_BYTES = 2.0
"""An FP4 (NVFP4/MXFP4) checkpoint of an MoE model quantises the FFNs, not the attention
projections: NVIDIA's DeepSeek-R1 NVFP4 checkpoint keeps its 61 attention modules in BF16 and its
dense and MoE FFNs in NVFP4 (TensorRT-LLM tech blog 1, "Precision Strategy", NVIDIA/TensorRT-LLM
01c4ece docs/source/blogs/tech_blog/blog1_...B200_GPUs.md); SGLang's GB200 part II (lm-sys.github.io
0f32018, 2025-09-25) runs q_b_proj in FP8 "different from the official NVIDIA checkpoint", i.e.
BF16 there; gpt-oss's MXFP4 checkpoint quantises only the MoE weights. So on an FP4 MoE model the
attention projections read 2 bytes a weight and run at the BF16 rate."""
Overlap = bool | Literal["sbo", "combine"]
"""How a step overlaps its all-to-all: False none; True two-batch overlap (`OVERLAP_EFFICIENCY`);
single-batch overlap, the transfers streamed beside the GEMMs that produce them or need none of
them, "sbo": the combine's sends beside the down GEMM, the dispatch's receives beside the shared
expert (Ant Group on H20, +8-10 % decode throughput at batch 20-56: lm-sys/lm-sys.github.io 2896b37
blog/2025-09-26-sglang-ant-group.md), "combine": "the combine communication with both the down GEMM
and the shared experts" (SGLang GB200 part II, 0f32018). A call's fixed cost does not stream."""
OVERLAP_EFFICIENCY = 0.5
"""Share of the shorter of compute and all-to-all that two-batch overlap hides (SGLang's TBO,
vLLM's --enable-dbo): SGLang's ablation on 96 H100 (lmsys blog 2025-05-05) measured +25.5 % decode
and +27-35 % prefill throughput from TBO; in this model's DeepSeek-V3 steps of those settings that
is 0.43 and 0.54 of the shorter part (split halves run less efficiently; launches serialise)."""
MLA_DECODE_MFU = 0.67
"""Share of peak BF16 an MLA decode kernel reaches when compute-bound: FlashMLA 660 TFLOPS on H800
SXM5 (989 peak; deepseek-ai/FlashMLA README, 2025-04-22 update). 128 heads share one latent, so
MLA decode attention is compute-bound where GQA's is memory-bound."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MoEStep:
    """One step of an EP gang, per part (ms), as every rank sees it."""

    dense_ms: float
    experts_ms: float
    dispatch_ms: float
    combine_ms: float
    allreduce_ms: float
    overhead_ms: float
    total_ms: float
    imbalance: float
    tokens_per_rank: int

    @property
    def a2a_share(self) -> float:
        """Share of the step spent in dispatch and combine (0..1)."""
        return (self.dispatch_ms + self.combine_ms) / self.total_ms if self.total_ms > 0 else 0.0


def default_imbalance(pairs: float, ep: int) -> float:
    """Max over mean GPU load when `pairs` (token, expert) choices fall uniformly on `ep` GPUs:
    the expected maximum of `ep` Poisson loads of mean m is about m + sqrt(2 m ln ep)."""
    if ep <= 1 or pairs <= 0:
        return 1.0
    mean = pairs / ep
    return min(1.0 + math.sqrt(2.0 * math.log(ep) / mean), float(ep))


def attention_params_b(model: ModelSpec) -> float:
    """Parameters (billions) of every layer's attention projections: MLA's query down and up
    projections, its joint KV down projection, the per-head K and V up projections (absorbed into
    the query and the output at decode, the same weights) and the output projection; GQA's Q, K, V
    and O."""
    h, heads = model.hidden, model.heads
    if model.attention == "mla":
        latent = model.head_dim - MLA_ROPE_DIM
        qk, v = model.qk_head_dim or model.head_dim, model.v_head_dim or model.head_dim
        per = (h * MLA_Q_LORA_RANK + MLA_Q_LORA_RANK * heads * qk + h * model.head_dim
               + latent * heads * (qk - MLA_ROPE_DIM + v) + heads * v * h)
    else:
        per = h * (heads + 2 * model.kv_heads) * model.head_dim + heads * model.head_dim * h
    return min(per * model.layers / 1e9, model.dense_active_params_b)


def _dense_parts(model: ModelSpec, gpu: GpuSpec, tp: int, mfu: float) -> tuple[float, float, float]:
    """(seconds per token of the dense part's GEMMs, the LM head's seconds per sampled position,
    bytes of its weights per GPU): the attention projections at their own format where it differs
    from the rest (`FP4_ATTENTION_BYTES`); the embedding a gather (`physics.flops`)."""
    rate = gpu.tflops(model.compute) * 1e12
    attn = attention_params_b(model) * 1e9 if model.compute == "fp4" else 0.0
    rest_active = (model.dense_active_params_b - model.embedding_params_b - model.head_params_b) * 1e9 - attn
    per_token = 2 * rest_active / (tp * rate * mfu) + 2 * attn / (tp * gpu.tflops("bf16") * 1e12 * mfu)
    weights = (model.dense_params_b - model.embedding_params_b) * 1e9 * model.weight_bytes - attn * (
        model.weight_bytes - FP4_ATTENTION_BYTES)
    return per_token, 2 * model.head_params_b * 1e9 / (tp * rate * mfu), weights / tp


def _attn_rate(model: ModelSpec, gpu: GpuSpec) -> float:
    """The tensor rate an MLA decode kernel runs at: FP8 when the KV cache is FP8 (the query is
    quantised too and the kernel runs FP8 MMAs: TensorRT-LLM tech blog 3 "FP8 KV Cache", NVIDIA/
    TensorRT-LLM 01c4ece; SGLang GB200 part II's FP8 attention, 1.8x faster than BF16), else BF16."""
    if model.attention == "mla" and model.kv_bytes == 1 and gpu.fp8_tflops:
        return gpu.fp8_tflops * 1e12
    return gpu.bf16_tflops * 1e12


@dataclass(frozen=True, slots=True)
class _Fixed:
    """The parts of a step that do not depend on the context its sequences read."""

    experts_ms: float
    dispatch_ms: float
    combine_ms: float
    allreduce_ms: float
    overhead_ms: float
    imbalance: float
    dispatch_stream_ms: float = 0.0  # of dispatch and combine, the transfers: what `Overlap` can hide
    combine_stream_ms: float = 0.0
    shared_ms: float = 0.0  # the shared expert's GEMMs, which need no dispatched token


def _fixed(model: ModelSpec, gpu: GpuSpec, tp: int, dp: int, links: GangLinks, tokens: int, prefill: bool,
           tp_link: LinkCost, imbalance: float | None, expert_parallel: bool, eff: Efficiency,
           a2a: str | None = None, dispatch: str | None = None) -> _Fixed:
    moe = model.moe
    assert moe is not None
    rate = gpu.tflops(model.compute) * 1e12
    mfu = (eff.fp8_mfu if gpu.low_precision(model.compute) else eff.prefill_mfu) if prefill else eff.decode_mfu
    hbm = gpu.memory_gb_s * 1e9 * eff.decode_mbu
    ep = tp * dp if expert_parallel else tp
    pairs = float(tokens * (dp if expert_parallel else 1) * moe.experts_per_token)
    load = imbalance if imbalance is not None else default_imbalance(pairs, ep)
    per_expert = moe.expert_params(model.hidden)
    touched = expected_experts(moe.routed_experts, moe.experts_per_token, pairs / moe.experts_per_token,
                               moe.routing_skew) / ep
    expert_compute_s = 2 * per_expert * pairs / ep * load / (rate * mfu)
    expert_memory_s = touched * per_expert * model.expert_bytes / hbm
    experts_ms = moe.moe_layers * roofline_s(expert_compute_s, expert_memory_s) * 1e3
    dispatch_ms = combine_ms = 0.0
    streams = (0.0, 0.0)
    shared = moe.shared_experts * per_expert / tp
    shared_ms = moe.moe_layers * roofline_s(2 * shared * tokens / (rate * mfu),
                                            shared * model.weight_bytes / hbm) * 1e3
    if expert_parallel and ep > 1:
        mode = a2a or ("high-throughput" if prefill else "low-latency")
        groups = moe.groups_per_token if moe.groups > 1 else 0
        dispatch_bytes = DISPATCH_BYTES[dispatch or default_dispatch(model.compute)]
        sent = a2a_parts(tokens, model.hidden, moe.experts_per_token, dispatch_bytes, ep, links, mode, groups,
                         experts=moe.routed_experts)
        back = a2a_parts(tokens, model.hidden, moe.experts_per_token, float(BF16), ep, links, mode, groups,
                         experts=moe.routed_experts, dispatch=False)
        dispatch_ms, combine_ms = moe.moe_layers * sum(sent) / 1e3, moe.moe_layers * sum(back) / 1e3
        streams = moe.moe_layers * sent[1] / 1e3, moe.moe_layers * back[1] / 1e3
    reduces = model.layers * 2 - (moe.moe_layers if expert_parallel else 0)
    ar_ms = reduces * allreduce_ms(tokens * model.hidden * BF16, tp, tp_link, gpu) if tp > 1 else 0.0
    overhead_ms = model.layers * (eff.prefill_layer_overhead_ms if prefill else eff.decode_layer_overhead_ms) + (
        0.0 if prefill else eff.step_overhead_ms)
    return _Fixed(experts_ms=experts_ms, dispatch_ms=dispatch_ms, combine_ms=combine_ms, allreduce_ms=ar_ms,
                  overhead_ms=overhead_ms, imbalance=load, dispatch_stream_ms=streams[0], combine_stream_ms=streams[1],
                  shared_ms=shared_ms)


def _assemble(dense_ms: float, f: _Fixed, tokens: int, overlap: Overlap) -> MoEStep:
    compute_ms = dense_ms + f.experts_ms + f.allreduce_ms
    a2a_ms = f.dispatch_ms + f.combine_ms
    down_ms = f.experts_ms / 3  # the down GEMM: one of an expert's three equal projections
    if overlap == "sbo":
        hidden = min(f.combine_stream_ms, down_ms) + min(f.dispatch_stream_ms, f.shared_ms)
    elif overlap == "combine":
        hidden = min(f.combine_stream_ms, down_ms + f.shared_ms)
    else:
        hidden = OVERLAP_EFFICIENCY * min(compute_ms, a2a_ms) if overlap else 0.0
    return MoEStep(dense_ms=dense_ms, experts_ms=f.experts_ms, dispatch_ms=f.dispatch_ms, combine_ms=f.combine_ms,
                   allreduce_ms=f.allreduce_ms, overhead_ms=f.overhead_ms,
                   total_ms=compute_ms + a2a_ms - hidden + f.overhead_ms, imbalance=f.imbalance,
                   tokens_per_rank=tokens)


def _attn_mfu(model: ModelSpec, eff: Efficiency, rate_mfu: float) -> float:
    return MLA_DECODE_MFU if model.attention == "mla" else rate_mfu


def moe_forward(model: ModelSpec, gpu: GpuSpec, tp: int, dp: int, links: GangLinks,
                chunks: Sequence[tuple[int, int]], decodes: int, decode_context: int, *, tp_link: LinkCost = LOCAL,
                imbalance: float | None = None, overlap: Overlap = False, expert_parallel: bool = True,
                eff: Efficiency = DEFAULT, a2a: str | None = None, queries: int = 1,
                dispatch: str | None = None) -> MoEStep:
    """One engine step of every DP rank at once, each with prefill `chunks` as (new tokens, cached
    tokens before them) and `decodes` sequences reading `decode_context` tokens in all (the
    `costmodel.forward_ms` contract). `queries`: tokens of each decoding sequence that attend over
    its context (a speculative verify's k + 1: the KV is read once, the attention FLOPs are k + 1
    times a single query's; FlashMLA packs the query tokens x heads into its rows).
    `expert_parallel` False: the experts are split by TP inside each rank (no all-to-all). Every
    rank is taken to carry the same load (the router balances them; ranks are in lockstep at every
    MoE layer)."""
    if model.moe is None:
        raise ValueError(f"{model.name} is a dense model: no expert layers to price")
    if not chunks:
        if decodes <= 0:
            return _assemble(0.0, _Fixed(0.0, 0.0, 0.0, 0.0, 0.0, 1.0), 0, overlap)
        return moe_decode(model, gpu, tp, dp, links, decodes, tp_link, imbalance, overlap, expert_parallel,
                          eff, a2a, queries, dispatch).step(decode_context)
    new = pairs = cached = 0.0
    for n, c in chunks:
        new += n
        pairs += n * n / 2 + n * c
        cached += c
    tokens = int(new) + decodes
    mfu = eff.fp8_mfu if gpu.low_precision(model.compute) else eff.prefill_mfu
    per_token, head, weights = _dense_parts(model, gpu, tp, mfu)
    compute_s = (per_token * tokens + head * (len(chunks) + decodes)
                 + attention_s(model, gpu, pairs, eff.attention_mfu) / tp
                 + attention_flops(model, float(decode_context) * max(queries, 1), True) / (
                     tp * _attn_rate(model, gpu) * _attn_mfu(model, eff, eff.decode_mfu)))
    memory_s = (weights + model.kv_bytes_per_token() * (cached + decode_context) / kv_shards(model, tp)) / (
        gpu.memory_gb_s * 1e9 * eff.decode_mbu)
    fixed = _fixed(model, gpu, tp, dp, links, tokens, True, tp_link, imbalance, expert_parallel, eff, a2a, dispatch)
    return _assemble(roofline_s(compute_s, memory_s) * 1e3 + replicated_ms(model, gpu, new), fixed, tokens, overlap)


@dataclass(frozen=True, slots=True)
class MoEDecode:
    """A decode-only step of a fixed batch as a function of the context it reads (what the
    simulator's fast-forward evaluates step after step): `moe_forward` without chunks."""

    compute_s: float
    attn_s_per_token: float
    weights_s: float
    kv_s_per_token: float
    fixed: _Fixed
    batch: int
    overlap: Overlap

    def step(self, context_tokens: int) -> MoEStep:
        dense_s = roofline_s(self.compute_s + self.attn_s_per_token * context_tokens,
                             self.weights_s + self.kv_s_per_token * context_tokens)
        return _assemble(dense_s * 1e3, self.fixed, self.batch, self.overlap)

    def ms(self, context_tokens: int) -> float:
        return self.step(context_tokens).total_ms


@functools.lru_cache(maxsize=16384)
def moe_decode(model: ModelSpec, gpu: GpuSpec, tp: int, dp: int, links: GangLinks, batch: int, tp_link: LinkCost,
               imbalance: float | None, overlap: Overlap, expert_parallel: bool, eff: Efficiency,
               a2a: str | None = None, queries: int = 1, dispatch: str | None = None) -> MoEDecode:
    if model.moe is None:
        raise ValueError(f"{model.name} is a dense model: no expert layers to price")
    b = max(batch, 1)
    hbm = gpu.memory_gb_s * 1e9 * eff.decode_mbu
    per_pair = attention_flops(model, float(max(queries, 1)), True) / (
        tp * _attn_rate(model, gpu) * _attn_mfu(model, eff, eff.decode_mfu))
    per_token, head, weights = _dense_parts(model, gpu, tp, eff.decode_mfu)
    return MoEDecode(compute_s=(per_token + head) * b, attn_s_per_token=per_pair, weights_s=weights / hbm,
                     kv_s_per_token=model.kv_bytes_per_token() / kv_shards(model, tp) / hbm,
                     fixed=_fixed(model, gpu, tp, dp, links, b, False, tp_link, imbalance, expert_parallel, eff, a2a,
                                  dispatch),
                     batch=b, overlap=overlap)


def moe_step(model: ModelSpec, gpu: GpuSpec, tp: int, dp: int, links: GangLinks, *, prefill_tokens: int = 0,
             prefill_context: int = 0, prefill_sequences: int = 1, decodes: int = 0, decode_context: int = 0,
             tp_link: LinkCost = LOCAL, imbalance: float | None = None, overlap: Overlap = False,
             expert_parallel: bool = True, eff: Efficiency = DEFAULT, a2a: str | None = None,
             verify_tokens: int = 1, dispatch: str | None = None) -> MoEStep:
    """`moe_forward` for the cost command: `prefill_tokens` new prompt tokens per rank (of
    `prefill_sequences` prompts of equal length, each after `prefill_context` cached tokens), or
    `decodes` sequences reading `decode_context` tokens each, each sequence passing
    `verify_tokens` tokens through the layers (a speculative verify: the drafts and its own) while
    its KV cache is read once (and attended by every one of them). `dispatch`: the format the
    all-to-all sends (`alltoall.DISPATCH_BYTES`; None: DeepEP's, FP8 for low-precision weights)."""
    if prefill_tokens > 0:
        seqs = max(1, min(prefill_sequences, prefill_tokens))
        base, extra = divmod(prefill_tokens, seqs)
        chunks = [(base + (1 if k < extra else 0), prefill_context) for k in range(seqs)]
        return moe_forward(model, gpu, tp, dp, links, chunks, 0, 0, tp_link=tp_link, imbalance=imbalance,
                           overlap=overlap, expert_parallel=expert_parallel, eff=eff, a2a=a2a, dispatch=dispatch)
    return moe_forward(model, gpu, tp, dp, links, (), decodes * max(verify_tokens, 1), decodes * decode_context,
                       tp_link=tp_link, imbalance=imbalance, overlap=overlap, expert_parallel=expert_parallel,
                       eff=eff, a2a=a2a, queries=max(verify_tokens, 1), dispatch=dispatch)
