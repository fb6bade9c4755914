"""MoE serving points (`kind: moe`) as the cost model prices them: an expert-parallel gang's
prefill or decode step (`physics.gangqueries.moe`), or, for a whole closed-loop run, its steady
state (`physics.moeserving`), with the batch, context, overlap and attention-DP layout read from
what each point states (`loadtest.fidelity.predict` lists the conventions)."""

from __future__ import annotations

from typing import Any

from loadtest.fidelity.fields import dtypes_of, int_of, link_of, num, speculation
from physics import catalog, costmodel, moecost, moeserving
from physics import gangqueries as gangs
from physics import queries as cost


def moe_point(p: dict[str, Any], model: str, gpu: str) -> tuple[float | None, str]:
    """An MoE serving point's throughput per GPU (or per node) as the gang query prices it."""
    phase = str(p.get("phase") or "")
    if phase not in ("prefill", "decode"):
        return None, "phase not stated"
    dp = num(p, "dp")
    if dp is None:
        return None, "data-parallel size not stated"
    weights, kv = dtypes_of(p)
    tokens, batch = num(p, "tokens"), num(p, "batch")
    if phase == "decode" and batch is None and isinstance(p.get("kv_full_batch"), dict):
        batch = kv_full_batch(p, model, gpu)
    if phase == "prefill" and not tokens:
        return None, "prefill tokens per rank not stated"
    if phase == "decode" and not batch:
        return None, "decode batch per rank not stated"
    # attention DP (SGLang's --tp N --dp N, TensorRT-LLM's attention DP): tp names the whole gang;
    # each DP rank's attention runs on ep / dp GPUs
    ep = num(p, "ep")
    tp = max(1, int(ep) // int(dp)) if ep else int_of(p, "tp", 1)
    draft, length = speculation(p.get("spec")) if phase == "decode" else (0, None)
    if batch and str(p.get("batch_per", "rank")).startswith("gang"):
        batch = max(1.0, batch / dp)  # a benchmark's concurrency over every DP rank
    # a gang over several nodes ("nvlink + rdma") runs its all-to-all across the network
    link = "rdma" if "rdma" in str(p.get("link") or "").lower() else link_of(p)
    # two-batch overlap where the point says `overlap: true`; `overlap: sbo ...` or `combine ...`:
    # single-batch overlap, as the source names it (`moecost.Overlap`)
    said = str(p.get("overlap") or "").split(" ")[0].rstrip(":")
    tbo: moecost.Overlap = "sbo" if said == "sbo" else "combine" if said == "combine" else p.get("overlap") is True
    prompt, output = num(p, "prompt_tokens"), num(p, "output_tokens")
    answer = gangs.moe(model, gpu, tp, int(dp), phase, link, tokens=int(tokens or 0),
                      prompts=int_of(p, "prompts", 1), batch=int(batch or 0), context=_moe_context(p, phase),
                      domain_gpus=int_of(p, "gpus_per_node", 8), gbps=num(p, "gbps"), overlap=tbo,
                      dtype=weights, draft_tokens=draft, acceptance_length=length, kv_dtype=kv)
    per_gpu = float(answer["tokens_per_s_per_gpu"])
    if phase == "decode" and "whole run" in str(p.get("convention", "")) and prompt and output and not draft:
        if "tensorrt" not in str(p.get("framework") or "").lower():
            # `physics.moeserving` admits whole prompts beside the decodes (trtllm-bench's engine);
            # vLLM and SGLang chunk them, so their whole runs are another closed loop
            return None, ("a whole run of an engine other than TensorRT-LLM's (which admits whole prompts, "
                          "as physics.moeserving prices it) is not priced")
        budget = int_of(p, "max_num_tokens", moeserving.TRTLLM_MAX_NUM_TOKENS)
        per_gpu = float(gangs.moe_run(model, gpu, tp, int(dp), link, batch=int(batch or 1), prompt=int(prompt),
                                      output=int(output), max_num_tokens=budget,
                                      domain_gpus=int_of(p, "gpus_per_node", 8), gbps=num(p, "gbps"),
                                      dtype=weights, kv_dtype=kv)["tokens_per_s_per_gpu"])
    if p["unit"] == "tokens/s-per-node":
        return per_gpu * int_of(p, "gpus_per_node", 8), ""
    if p["unit"] == "tokens/s-per-gpu":
        return per_gpu, ""
    return None, f"no prediction for an MoE point in {p['unit']}"


def kv_full_batch(p: dict[str, Any], model: str, gpu: str) -> float:
    """The decode batch per rank of a run whose batch was "chosen to make KV cache roughly full"
    (SGLang GB200 part II, lm-sys/lm-sys.github.io 0f32018 blog/2025-09-25-gb200-part-2.md, which
    states that batch, 1408 at 2k ISL, for one precision only and credits FP8 KV with "a larger
    number of tokens in the KV cache, enabling ... larger batch sizes"): the stated batch of the
    reference run (`kv_full_batch: {batch, dtype, kv_dtype}`) scaled by the KV tokens a rank holds
    in the point's formats over those it holds in the reference's (`costmodel.kv_capacity_tokens`:
    the memory the weights leave, over the KV bytes a token takes)."""
    ref = p["kv_full_batch"]
    ep = int_of(p, "ep", 1)
    weights, kv = dtypes_of(p)
    ref_weights, ref_kv = dtypes_of({"dtype": ref.get("dtype"), "kv_dtype": ref.get("kv_dtype")})
    part = catalog.gpu(gpu)
    held = costmodel.kv_capacity_tokens(cost.model_spec(model, weights, kv), part, 1, ep=ep)
    ref_held = costmodel.kv_capacity_tokens(cost.model_spec(model, ref_weights, ref_kv), part, 1, ep=ep)
    if ref_held <= 0:
        raise ValueError("the reference run's weights leave no room for a KV cache")
    return max(1.0, float(ref["batch"]) * held / ref_held)


def _moe_context(p: dict[str, Any], phase: str) -> int:
    """The context a decode step reads: the point's `context`, or else its prompt and half its
    output (a step's time is linear in the context it reads, so a generation's mean step is the
    step at its mean context); a prefill's cached tokens: `context` or none."""
    context = num(p, "context")
    if context is not None or phase != "decode":
        return int(context or 0)
    prompt, output = num(p, "prompt_tokens"), num(p, "output_tokens")
    return int((prompt or 0) + (output or 0) / 2)
