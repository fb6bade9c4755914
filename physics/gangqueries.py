"""`python -m pools cost moe|pp ...`: what the cost model predicts for a gang of GPUs, an
expert-parallel one (`moe`, and one all-to-all: `a2a`) or a pipeline (`pp`), as one JSON object
with the inputs echoed and the links it assumed. The single-group queries, and the link, model
and argument helpers these share, are `physics.queries`'."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from physics import a2akernels, alltoall, catalog, costmodel, moecost, moeserving, pipeline
from physics.queries import (
    GPUS_PER_NODE,
    LINKS,
    NETWORK,
    dtype_of,
    fabric,
    link,
    link_view,
    model_spec,
    positive,
    speculative_length,
    tp_link_name,
    tp_link_of,
)
from topology import LinkKind
from topology.gpus import gpu_facts
from topology.kinds import DEFAULTS
from topology.readers.spec import FABRICS

A2A_DTYPES = tuple(alltoall.DISPATCH_BYTES)
"""What an all-to-all dispatches, scales included (`alltoall.DISPATCH_BYTES`: fp8 is DeepEP's format)."""
GANG_LINKS = ("nvlink", "xgmi", "rdma", "efa", "cross-rail", "tcp")


def gang_links(link_name: str, gpu: str, gang: int, domain_gpus: int | None, gbps: float | None, sms: int = 0
                ) -> alltoall.GangLinks:
    """Where an EP gang's all-to-all runs: nvlink, the whole gang in one NVLink domain (xgmi, AMD's
    name for it: one Infinity Fabric mesh); otherwise `domain_gpus` of it per domain (default 8)
    joined by one NIC per GPU of `--gbps`; `sms` 0: unbounded. The domain's links are the part's own."""
    if sms < 0 or link_name not in GANG_LINKS:
        raise ValueError(f"--sms must be 0 (unbounded) or more, got {sms}" if sms < 0 else
                         f"--link for a gang is one of {', '.join(GANG_LINKS)}, not {link_name!r}")
    if link_name == "xgmi":
        if gpu_facts(gpu).fabric != "xgmi":
            raise ValueError(f"--link xgmi is AMD's Infinity Fabric; {gpu}'s own domain is --link nvlink")
        link_name = "nvlink"
    if gbps is not None and link_name == "nvlink":
        raise ValueError("--gbps is a network rate: it goes with --link rdma, efa, cross-rail or tcp")
    if domain_gpus is not None:
        positive(domain_gpus=domain_gpus)
    line, _ = fabric("nvswitch", gpu, gang)
    nic = link("tcp" if link_name == "tcp" else "rdma", gbps)
    gpu_initiated = alltoall.gpu_initiated(link_name)
    if link_name == "efa":  # RDMA over AWS's SRD: its latency (topology/readers/spec.py)
        nic, link_name = replace(nic, latency_us=FABRICS["efa"][2]), "rdma"
    d = gang if link_name == "nvlink" else min(domain_gpus or GPUS_PER_NODE, gang)
    return alltoall.GangLinks(carrier=link_name, domain_ranks=d, nvlink_gb_s=line,  # type: ignore[arg-type]
                             nic_gb_s=nic.bandwidth_gb_s, nic_latency_us=nic.latency_us, sms=sms,
                             gpu_initiated=gpu_initiated)


def moe(model: str, gpu: str, tp: int, dp: int, phase: str, link_name: str, *, tokens: int = 0, prompts: int = 1,
        batch: int = 0, context: int = 0, domain_gpus: int | None = None, gbps: float | None = None,
        imbalance: float | None = None, overlap: moecost.Overlap = False, expert_parallel: bool = True,
        dtype: str | None = None, a2a: str | None = None, sms: int = 0, draft_tokens: int = 0,
        acceptance_rate: float | None = None, acceptance_length: float | None = None,
        kv_dtype: str | None = None, dispatch_dtype: str | None = None) -> dict[str, Any]:
    """One step of an MoE gang of `dp` data-parallel ranks of TP=`tp` (`physics.moecost`);
    `a2a`: the all-to-all kernel (`a2akernels.KERNELS`; default DeepEP's normal kernels at prefill,
    its low-latency ones at decode) on `sms` SMs (0: unbounded). Decode with `draft_tokens` > 0
    (MTP): the gang verifies k + 1 tokens of every sequence in one step (the KV read once) after k
    draft passes of one layer each, and yields the acceptance length per sequence. `kv_dtype`: the
    KV cache's format (fp8: half the bytes, and MLA decode attention at the FP8 rate).
    `dispatch_dtype`: the format the all-to-all sends (`A2A_DTYPES`; None: DeepEP's, fp8 for
    low-precision weights, bf16 for bf16 ones)."""
    if a2a is not None:
        a2akernels.kernel(a2a)
    if dispatch_dtype is not None and dispatch_dtype not in A2A_DTYPES:
        raise ValueError(f"unknown dispatch dtype {dispatch_dtype!r} (known: {', '.join(A2A_DTYPES)})")
    positive(tp=tp, dp=dp)
    spec = model_spec(model, dtype, kv_dtype)
    if spec.moe is None:
        raise ValueError(f"{model} is a dense model: `cost moe` prices expert layers (MoE models: "
                         f"{', '.join(sorted(n for n, m in catalog.models().items() if m.moe))})")
    if phase not in ("prefill", "decode"):
        raise ValueError(f"--phase is prefill or decode, not {phase!r}")
    if phase == "prefill":
        positive(tokens=tokens, prompts=prompts)
    else:
        positive(batch=batch)
    if context < 0:
        raise ValueError(f"--context must be 0 or more, got {context}")
    if imbalance is not None and imbalance < 1:
        raise ValueError(f"--imbalance is max over mean GPU load, at least 1, got {imbalance}")
    length = speculative_length(draft_tokens, acceptance_rate, acceptance_length)
    if length is not None and phase != "decode":
        raise ValueError("--draft-tokens: speculative decoding is a decode setting")
    links = gang_links(link_name, gpu, tp * dp, domain_gpus, gbps, sms)
    tp_line, _ = fabric("nvswitch", gpu, tp)
    tp_link = costmodel.LinkCost(bandwidth_gb_s=tp_line, latency_us=DEFAULTS[LinkKind.NVSWITCH].latency_us,
                                 switched=True)
    step = moecost.moe_step(spec, catalog.gpu(gpu), tp, dp, links, prefill_tokens=tokens if phase == "prefill" else 0,
                            prefill_context=context if phase == "prefill" else 0, prefill_sequences=prompts,
                            decodes=batch if phase == "decode" else 0, decode_context=context, tp_link=tp_link,
                            imbalance=imbalance, overlap=overlap, expert_parallel=expert_parallel, a2a=a2a,
                            verify_tokens=draft_tokens + 1, dispatch=dispatch_dtype)
    total_ms, draft_ms = step.total_ms, 0.0
    if length is not None:
        plain = moecost.moe_step(spec, catalog.gpu(gpu), tp, dp, links, decodes=batch, decode_context=context,
                                 tp_link=tp_link, imbalance=imbalance, overlap=overlap,
                                 expert_parallel=expert_parallel, a2a=a2a, dispatch=dispatch_dtype)
        draft_ms = draft_tokens * plain.total_ms / spec.layers
        total_ms += draft_ms
    per_rank = tokens if phase == "prefill" else batch * (length or 1.0)
    ep = tp * dp if expert_parallel else tp
    return {"what": "moe", "model": model, "gpu": gpu, "tp": tp, "dp": dp, "ep": ep, "expert_parallel": expert_parallel,
            "phase": phase, "a2a": a2a or ("deepep-normal" if phase == "prefill" else "deepep-ll"), "sms": sms,
            "dispatch_dtype": dispatch_dtype or alltoall.default_dispatch(spec.compute),
            "tokens": tokens, "prompts": prompts, "batch": batch, "context": context,
            "overlap": overlap, "link": {"name": link_name, "domain_gpus": links.domain_ranks,
                                         "nvlink_gb_s": links.nvlink_gb_s, "nic_gb_s": links.nic_gb_s,
                                         "nic_latency_us": links.nic_latency_us},
            "fits": costmodel.fits(spec, catalog.gpu(gpu).memory_gb, tp, ep=ep),
            "imbalance": step.imbalance, "dense_ms": step.dense_ms, "experts_ms": step.experts_ms,
            "dispatch_ms": step.dispatch_ms, "combine_ms": step.combine_ms, "allreduce_ms": step.allreduce_ms,
            "overhead_ms": step.overhead_ms, "a2a_share": step.a2a_share, "ms": total_ms,
            "speculative": None if length is None else {"draft_tokens": draft_tokens, "acceptance_length": length,
                                                        "draft_ms": draft_ms, "verify_ms": step.total_ms},
            "tokens_per_s_per_gpu": per_rank / tp / (total_ms / 1e3) if total_ms > 0 else 0.0}


def moe_run(model: str, gpu: str, tp: int, dp: int, link_name: str, *, batch: int, prompt: int, output: int,
            max_num_tokens: int = moeserving.TRTLLM_MAX_NUM_TOKENS, domain_gpus: int | None = None,
            gbps: float | None = None, dtype: str | None = None, kv_dtype: str | None = None) -> dict[str, Any]:
    """A closed-loop serving run's steady state on an attention-DP + EP gang under in-flight
    batching (`physics.moeserving`): `batch` requests in flight per DP rank of TP=`tp`."""
    positive(tp=tp, dp=dp, batch=batch, prompt=prompt, output=output, max_num_tokens=max_num_tokens)
    spec = model_spec(model, dtype, kv_dtype)
    if spec.moe is None:
        raise ValueError(f"{model} is a dense model: a gang run prices expert layers")
    links = gang_links(link_name, gpu, tp * dp, domain_gpus, gbps)
    tp_line, _ = fabric("nvswitch", gpu, tp)
    tp_link = costmodel.LinkCost(bandwidth_gb_s=tp_line, latency_us=DEFAULTS[LinkKind.NVSWITCH].latency_us,
                                 switched=True)
    run = moeserving.closed_loop_run(spec, catalog.gpu(gpu), tp, dp, links, batch, prompt, output,
                                     max_num_tokens=max_num_tokens, tp_link=tp_link)
    return {"what": "moe-run", "model": model, "gpu": gpu, "tp": tp, "dp": dp, "batch": batch, "prompt": prompt,
            "output": output, "max_num_tokens": max_num_tokens, "in_flight": run.in_flight,
            "prompts_per_step": run.prompts_per_step, "prompt_share": run.prompt_share, "decode_ms": run.decode_ms,
            "mixed_ms": run.mixed_ms, "ms": run.step_ms, "tokens_per_s_per_gpu": run.tokens_per_s_per_gpu}


PP_LINKS = ("nvswitch", "nvlink", "xgmi", "pcie", "sys", "rdma", "tcp")


def pp(model: str, gpu: str, tp: int, stages: int, phase: str, boundaries: list[str], *, tokens: int = 0,
       batch: int = 0, context: int = 0, gbps: float | None = None, dtype: str | None = None,
       link_name: str = "nvswitch", chunk: int = pipeline.PP_CHUNK_TOKENS) -> dict[str, Any]:
    """A prefill or a decode cycle over `stages` pipeline stages of TP=`tp` (`physics.pipeline`);
    `boundaries`: one link kind for every boundary, or one per boundary (stages - 1). A prefill
    streams the prompt through the stages in chunks of `chunk` tokens (0: one pass)."""
    positive(tp=tp, pp=stages)
    spec = model_spec(model, dtype)
    if stages > spec.layers:
        raise ValueError(f"--pp {stages} is more stages than {model}'s {spec.layers} layers")
    kinds = boundaries * (stages - 1) if len(boundaries) == 1 else boundaries
    if len(kinds) != stages - 1:
        raise ValueError(f"--boundary: one link for all, or {stages - 1} (one per boundary), got {len(boundaries)}")
    for k in kinds:
        if k not in PP_LINKS:
            raise ValueError(f"unknown boundary link {k!r} (known: {', '.join(PP_LINKS)})")
    if gbps is not None and not any(k in NETWORK for k in kinds):
        raise ValueError("--gbps is a network rate: it needs an rdma or tcp boundary")
    if phase not in ("prefill", "decode"):
        raise ValueError(f"--phase is prefill or decode, not {phase!r}")
    if phase == "prefill":
        positive(tokens=tokens)
    else:
        positive(batch=batch)
    kinds, link_name = [tp_link_name(k, gpu) for k in kinds], tp_link_name(link_name, gpu)
    links = [replace(link(k, gbps), hw="net") if k in NETWORK else
             tp_link_of(k, gpu, 2) if LINKS[k].is_gpu_fabric or k == "pcie" else replace(link(k), hw="pci")
             for k in kinds]
    tp_link = tp_link_of(link_name, gpu, tp)
    step = pipeline.pipeline_step(spec, catalog.gpu(gpu), tp, stages, tp_link, links,
                                  prefill_tokens=tokens if phase == "prefill" else 0,
                                  decodes=batch if phase == "decode" else 0, decode_context=context, chunk=chunk)
    produced = tokens if phase == "prefill" else batch
    return {"what": "pp", "model": model, "gpu": gpu, "tp": tp, "pp": stages, "phase": phase, "tokens": tokens,
            "chunk": chunk if phase == "prefill" else None, "batch": batch, "context": context,
            "dtype": dtype_of(spec), "gbps": gbps, "link": link_view(link_name, tp_link),
            "boundaries": [link_view(k, c) for k, c in zip(kinds, links, strict=True)],
            "fits": costmodel.fits(spec, catalog.gpu(gpu).memory_gb, tp, pp=stages),
            "stage_ms": list(step.stage_ms), "boundary_ms": list(step.boundary_ms),
            "micro_batches": step.micro_batches, "bubble": step.bubble, "ms": step.total_ms,
            "tokens_per_s_per_gpu": produced / (tp * stages) / (step.total_ms / 1e3) if step.total_ms > 0 else 0.0}


def a2a(gpu: str, ep: int, tokens: int, hidden: int, topk: int, dtype: str, mode: str, link_name: str = "rdma",
        domain_gpus: int | None = None, gbps: float | None = None, groups_per_token: int = 0,
        sms: int = 0, *, experts: int = 0, dispatch: bool = True) -> dict[str, Any]:
    """One dispatch (or combine: `dispatch` False) (`alltoall.a2a_us`): `tokens` per rank to `topk` of
    `ep` ranks, `dtype` elements; `experts`: the gang's routed experts (0: not stated)."""
    positive(ep=ep, tokens=tokens, hidden=hidden, topk=topk)
    a2akernels.kernel(mode)
    if dtype not in A2A_DTYPES:
        raise ValueError(f"unknown dispatch dtype {dtype!r} (known: {', '.join(A2A_DTYPES)})")
    links = gang_links(link_name, gpu, ep, domain_gpus, gbps, sms)
    element = alltoall.DISPATCH_BYTES[dtype]
    us = alltoall.a2a_us(tokens, hidden, topk, element, ep, links, mode, groups_per_token, experts=experts,
                         dispatch=dispatch)
    gb = tokens * topk * hidden * element / 1e9
    return {"what": "a2a", "gpu": gpu, "ep": ep, "tokens": tokens, "hidden": hidden, "topk": topk, "dtype": dtype,
            "mode": mode, "domain_gpus": links.domain_ranks, "us": us, "logical_gb_s": gb / (us * 1e-6) if us else 0.0}
