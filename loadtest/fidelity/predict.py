"""What the cost model predicts for one published point, in the point's own unit and by the
point's own counting convention (`physics/data/calibration.yaml`, `physics/data/published/*.yaml`).

Conventions the conversion applies, each written next to the points it concerns:
    decode ms             time per output token of one sequence (TPOT/ITL) at the point's batch
                          and context; `ms/context-token`: the slope of that time over the context
    decode tokens/s       per user (1000 / TPOT) unless the point counts otherwise: "(prompt tokens
                          + generated tokens) / time" (a whole generate call: the prefill and every
                          decode step), or `tokens/s-per-gpu` of one static batch (output x batch /
                          the batch's whole latency / TP)
    MoE "whole run"       a closed-loop run at fixed concurrency under in-flight batching (trtllm-bench):
                          its steady state, prompts admitted beside decodes within `max_num_tokens`,
                          the attention-DP ranks paced by the slowest (`physics.moeserving`)
    MoE `kv_full_batch`   a decode batch "chosen to make KV cache roughly full", stated for another
                          run's formats: scaled by the KV tokens a rank holds in this run's formats
    "end-to-end latency"  one offline batch: its prefill and every decode step
    a2a `p2p: false`      the kernel reaches its own node's peers through the NIC as well (NVSHMEM
                          P2P disabled: DeepEP's first low-latency kernels set NVSHMEM_DISABLE_P2P=1,
                          deepseek-ai/DeepEP ebfe47e deep_ep/buffer.py, until "LL nvlink p2p" #173,
                          2025-05-23): priced with every rank its own NVLink domain
    a2a `buffer: dense`   one all-to-all of a dense buffer, every expert's capacity (experts x tokens
                          rows, equal splits to every rank) whatever the routing: pplx-kernels'
                          torch.distributed baseline (tests/bench_all_to_all.py); priced with every
                          (row, expert-slot) a message, `topk` = `experts`
    a2a GB/s (`count`)    nodes-touched: a token once per node it is sent to, its own included
                          (DeepEP, UCCL-EP, MoRI, HybridEP internode tests); rows-received: every
                          token row a rank receives, its own included (their intranode tests);
                          remote-nodes: once per node other than its own
    pp-prefill            one prompt streamed through the stages in chunks (the point's chunk; where
                          the measurement does not state it, the source's own launch example for
                          that model and parallelism, `chunk_example`; else the engine default),
                          stages of a node joined by NVLink, nodes by RDMA
    TTFT `tokenized`      the servers on the measured path that tokenize the prompt text one after
                          another before the first token (`prompttext.tokenizations`): 2 behind
                          vLLM's PD proxy, 0 where the client sends token ids
A point the model cannot price (a condition not stated, a model or GPU the catalogue lacks, a
measurement under an open-loop load) gets None and the reason.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from loadtest.fidelity.fields import (
    DTYPES,
    dtypes_of,
    int_of,
    link_of,
    names,
    num,
    speculation,
)
from loadtest.fidelity.moepoints import moe_point
from loadtest.fidelity.prompttext import prompt_text_ms
from loadtest.fidelity.replay.closedloop import closed_loop_itl_ms
from loadtest.fidelity.replay.distserve import predicted_attainment
from loadtest.fidelity.replay.sharegpt import SOURCE
from physics import a2akernels, alltoall, catalog, collectives, fitted
from physics import gangqueries as gangs
from physics import queries as cost
from physics.pipeline import PP_CHUNK_TOKENS

OPS = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reducescatter", "alltoall": "alltoall",
       "all_to_all": "alltoall"}
BUS_FACTOR = {"allreduce": lambda k: 2 * (k - 1) / k, "allgather": lambda k: (k - 1) / k,
              "reducescatter": lambda k: (k - 1) / k, "alltoall": lambda k: (k - 1) / k}
"""nccl-tests' bus bandwidth = algorithm bandwidth x this (its PERFORMANCE.md)."""
VLLM_PD_PATH_MS = 35.0
"""What a disaggregated serving path adds to prefill + KV transfer + the first decode step when a
benchmark measures TTFT through it (two HTTP hops, the decode's wait for the connector to report
the KV in, two engine loops): the 128-token row of MOONCAKE-PD (46.09 ms) less the model's 11.1
ms for those three. A property of the measured system, not of isleserve's router; only pd-ttft
points use it (a free constant of the fit)."""
PER_CALL_US = 25.0
"""What timing one collective call on its own adds to it (`timing: per-call`: all_reduce_bench.py's
torch.distributed loop, a barrier before each call, the call launched from Python through
ProcessGroupNCCL, then a synchronize), which nccl-tests hides by timing `-n` calls back to back
(`collectives.LAUNCH_US` is what is left of it there): "PyTorch's per-call host overhead of some
20-30us", as the benchmark's own author states it (stas00/ml-engineering
network/benchmarks/all_reduce_bench.py @0cc3de50b2dd083c34d848a1dcb5bfe65fe3dace, module docstring;
the later version that hides it behind a busy device). The middle of that range, fixed: no other
source times calls one by one, so no fit may move it.
An all-to-all point timed the same way (`timing: per-call`: a barrier, then CUDA events around calls
launched from Python onto an idle stream) pays it once for each call the device waits on the host to
launch: the first, and each one after the host itself waited for the device (`host_calls`, read from
the harness: ADAI-EP-B200's DeepEP V2 arm dispatches with `do_cpu_sync=True`, whose host spins until
the received counts arrive before it allocates the outputs and launches the copy epilogue, so 2, its
FP8 cast running before the timing; its DeepEP V1 and UCCL arms launch dispatch and combine back to
back, 1)."""
SAMPLES = 16
"""Decode steps priced along a generation (the rest interpolated): the step grows with context."""


def predict(p: dict[str, Any]) -> tuple[float | None, str]:
    """The model's value for point `p` in the point's unit, or None and why not."""
    if p.get("excluded"):
        return None, f"excluded: {p['excluded']}"
    model, gpu, why = names(p)
    if why:
        return None, why
    kind, unit = p["kind"], p["unit"]
    try:
        if kind == "collective":
            return _collective(p, gpu)
        if kind == "a2a":
            return _a2a(p, gpu)
        if kind == "kv":
            return _kv(p, model)
        if model is None or gpu is None:
            return None, f"a {kind} point needs a catalogue model and GPU"
        if kind == "prefill" and unit == "ms":
            if "under load" in str(p.get("convention", "")):
                return None, "a TTFT under load (queueing, co-scheduled decodes): not priced by a formula"
            return _prefill_ms(p, model, gpu), ""
        if kind == "pd-ttft" and unit == "ms":
            return pd_ttft_ms(p, model, gpu), ""
        if kind == "pp-prefill":
            return _pp_prefill(p, model, gpu)
        if kind == "decode":
            return _decode(p, model, gpu)
        if kind == "moe":
            return moe_point(p, model, gpu)
        if kind == "attainment" and unit == "fraction":
            if not str(p.get("source", "")).startswith(SOURCE) or "rate_rps" not in p:
                return None, ("no replayable workload for this attainment point (loadtest.fidelity.replay has "
                              "DistServe's)")
            return predicted_attainment(model, gpu, int_of(p, "tp", 1), float(p["rate_rps"])), ""
    except ValueError as err:
        return None, f"not priced: {err}"
    return None, f"no prediction for a {kind} point in {unit}"


def host_launches_us(p: dict[str, Any]) -> float:
    """What a harness that times its calls one at a time (`timing: per-call`) adds to the point's
    device time: `PER_CALL_US` for each launch the device waits on (`host_calls`, 1 unless stated)."""
    return PER_CALL_US * int_of(p, "host_calls", 1) if p.get("timing") == "per-call" else 0.0


def _prefill_ms(p: dict[str, Any], model: str, gpu: str) -> float:
    weights, kv = dtypes_of(p)
    tokens = int_of(p, "tokens", 0) or int_of(p, "prompt_tokens", 0)
    if tokens <= 0:
        raise ValueError("prompt length not stated")
    return float(cost.prefill(model, gpu, int_of(p, "tp", 1), tokens, int_of(p, "context", 0), weights,
                              kv_dtype=kv)["ms"]) + prompt_text_ms(p, tokens)


def _step(model: str, gpu: str, tp: int, batch: int, context: int, weights: str | None, kv: str | None,
          spec: dict[str, Any] | None) -> float:
    """Time per output token of a sequence (speculative steps over their acceptance length)."""
    draft, length = speculation(spec)
    answer = cost.decode(model, gpu, tp, batch, context, weights, kv_dtype=kv, draft_tokens=draft,
                         acceptance_length=length if draft else None)
    return float(answer["ms"])


def _generation_ms(model: str, gpu: str, tp: int, batch: int, prompt: int, output: int, weights: str | None,
                   kv: str | None) -> float:
    """A whole generate call of one batch: the prefill of every prompt, then `output` decode steps
    whose context grows from the prompt (sampled at `SAMPLES` points, trapezoid between)."""
    pre = cost.prefill(model, gpu, tp, prompt, 0, weights, kv_dtype=kv, sequences=batch)["ms"] if prompt > 0 else 0.0
    return float(pre) + decoding_ms(output, lambda t: _step(model, gpu, tp, batch, prompt + t, weights, kv, None))


def decoding_ms(output: int, step_at: Callable[[int], float]) -> float:
    """`output` decode steps whose time `step_at(t)` grows with the tokens generated so far: the
    step priced at `SAMPLES` points, trapezoid between, plus the last."""
    marks = sorted({0, output - 1, *(round(i * (output - 1) / (SAMPLES - 1)) for i in range(SAMPLES))})
    steps = [step_at(t) for t in marks]
    between = sum((a + b) / 2 * (t1 - t0) for t0, t1, a, b in zip(marks, marks[1:], steps, steps[1:], strict=False))
    return between + steps[-1]


def _decode(p: dict[str, Any], model: str, gpu: str) -> tuple[float | None, str]:
    weights, kv = dtypes_of(p)
    unit, convention = p["unit"], str(p.get("convention", ""))
    tp, batch = int_of(p, "tp", 1), num(p, "batch")
    prompt, output, context = num(p, "prompt_tokens"), num(p, "output_tokens"), num(p, "context")
    concurrency = num(p, "concurrency")
    if unit == "ms/context-token":
        long = 65536
        a = _step(model, gpu, tp, 1, long, weights, kv, None)
        b = _step(model, gpu, tp, 1, 2 * long, weights, kv, None)
        return (b - a) / long, ""
    if unit == "tokens/s" and "prompt tokens + generated tokens" in convention:
        if prompt is None or output is None:
            return None, "the prompt and output lengths of the generate call are not stated"
        ms = _generation_ms(model, gpu, tp, int(batch or 1), int(prompt), int(output), weights, kv)
        return (prompt + output) * int(batch or 1) / (ms / 1e3), ""
    if unit in ("tokens/s-per-gpu", "ms") and ("static batch" in convention or "end-to-end latency" in convention
                                               or "total_latency" in convention):
        if batch is None or prompt is None or output is None:
            return None, "the batch, prompt and output lengths of the offline batch are not stated"
        ms = _generation_ms(model, gpu, tp, int(batch), int(prompt), int(output), weights, kv)
        return (ms, "") if unit == "ms" else (output * batch / (ms / 1e3) / tp, "")
    if concurrency is not None and concurrency > 1 and unit == "ms":
        if prompt is None or output is None:
            return None, "a loaded-system ITL needs prompt_tokens and output_tokens to replay its closed loop"
        return closed_loop_itl_ms(model, gpu, tp, int(concurrency), int(prompt), int(output),
                                  DTYPES.get(str(p.get("dtype") or "bf16"), "bf16"), link_of(p, "nvswitch")), ""
    if "open-loop" in convention or "request rate" in convention:
        return None, "an open-loop load whose batch and lengths are not stated"
    if batch is None:
        return None, "the batch is not stated"
    ctx = int(context) if context is not None else int(prompt or 0)
    ms = _step(model, gpu, tp, int(batch), ctx, weights, kv, p.get("spec"))
    if unit == "ms":
        return ms, ""
    if unit == "tokens/s":
        return 1000.0 / ms, ""
    return None, f"no prediction for a decode point in {unit}"


def _pp_prefill(p: dict[str, Any], model: str, gpu: str) -> tuple[float | None, str]:
    weights, _ = dtypes_of(p)
    tp, stages, tokens = int_of(p, "tp", 1), int_of(p, "pp", 1), int_of(p, "tokens", 0)
    if tokens <= 0:
        return None, "prompt length not stated"
    per_node = int_of(p, "gpus_per_node", 8)
    stages_per_node = max(1, per_node // tp)
    boundaries = ["nvswitch" if (b + 1) % stages_per_node else "rdma" for b in range(stages - 1)]
    chunk = int_of(p, "chunk", int_of(p, "chunk_example", PP_CHUNK_TOKENS))
    if stages == 1:
        answer = gangs.pp(model, gpu, tp, 1, "prefill", [], tokens=tokens, dtype=weights, chunk=chunk)
    else:
        answer = gangs.pp(model, gpu, tp, stages, "prefill", boundaries, tokens=tokens, dtype=weights, chunk=chunk)
    ms = float(answer["ms"])
    return (ms, "") if p["unit"] == "ms" else (tokens / (ms / 1e3), "")


def _collective(p: dict[str, Any], gpu: str | None) -> tuple[float | None, str]:
    op = OPS.get(p["op"], p["op"])
    if op not in BUS_FACTOR:
        return None, f"no prediction for a {op} collective"
    size, gpus = num(p, "bytes"), num(p, "gpus")
    if size is None or gpus is None:
        return None, "message size or GPU count not stated"
    link = link_of(p, "nvswitch")
    network = link in cost.NETWORK | collectives.EFA_NETWORKS  # efa: rdma over AWS EFA (queries.collective)
    gbps = num(p, "gbps") if network else None
    nodes = num(p, "nodes")
    per_node = int(gpus // nodes) if nodes and network else None
    algorithm = p.get("algorithm")
    us = cost.collective(op, int(size), int(gpus), link, gpu, gbps, per_node, nvls=p.get("nvls", True) is not False,
                         algorithm=str(algorithm).lower() if algorithm else None)["us"]
    us += host_launches_us(p)
    unit = p["unit"]
    if unit == "us":
        return us, ""
    if unit in ("GB/s-busbw", "GB/s-algbw") and us > 0:
        algbw = size / (us * 1e-6) / 1e9
        return algbw * (BUS_FACTOR[op](int(gpus)) if unit == "GB/s-busbw" else 1.0), ""
    return None, f"no prediction for a collective in {unit}"


def _kv(p: dict[str, Any], model: str | None) -> tuple[float | None, str]:
    link = link_of(p)
    unit, tokens, size, rails = p["unit"], num(p, "tokens"), num(p, "bytes"), num(p, "rails")
    if unit in ("ms", "us") and model and tokens:
        ms = cost.kv(model, int(tokens), link, num(p, "gbps"), int_of(p, "tp", 1), _nics(p))["ms"]
        return (ms if unit == "ms" else ms * 1e3), ""
    if unit == "GB/s" and size and rails:
        # a benchmark keeping many blocks in flight pays each block's set-up once per round of them
        # `memory: dram`: host buffers at both ends, the hosts' DRAM bounds the rate
        memory = "dram" if str(p.get("memory") or "gpu").lower().startswith("dram") else "gpu"
        blocks = num(p, "blocks_in_flight") or 1.0
        transport = "efa" if str(p.get("transport") or "").lower() == "efa" else "rdma"
        return cost.kv_payload_gb_s(size * blocks, link, num(p, "gbps"), int(rails), memory, blocks, transport), ""
    return None, "the transfer's size (tokens of a catalogue model, or bytes and NICs) is not stated"


def _nics(p: dict[str, Any]) -> int | None:
    """The NICs a node's ranks share for a KV transfer (`rails`) on a network link; None: one each."""
    rails = num(p, "rails")
    return int(rails) if rails and link_of(p) in cost.NETWORK else None


def _a2a(p: dict[str, Any], gpu: str | None) -> tuple[float | None, str]:
    if gpu is None:
        return None, "GPU not stated"
    ep, tokens, hidden, topk = num(p, "ep"), num(p, "tokens"), num(p, "hidden"), num(p, "topk")
    if not (ep and tokens and hidden and topk):
        return None, "EP size, tokens, hidden or top-k not stated"
    experts = int(num(p, "experts") or 0)
    if p.get("buffer") == "dense":
        if not experts:
            return None, "a dense all-to-all buffer needs the expert count"
        topk = experts
    mode = str(p.get("kernel") or p.get("mode") or "deepep-normal")
    try:
        a2akernels.kernel(mode)
    except ValueError:
        return None, f"kernel {mode} is not one the model knows"
    link = "nvlink" if link_of(p) in ("nvlink", "nvswitch", "xgmi") else "efa" if p.get("network") == "efa" else "rdma"
    per_node = int_of(p, "gpus_per_node", 8)
    if link == "nvlink":
        per_node = int(ep)
    reach = per_node
    if p.get("p2p") is False and link != "nvlink":
        # peers on its own node through the NIC too (NVSHMEM P2P off): each rank its own domain
        reach = 1
    gbps = num(p, "gbps") if link != "nvlink" else None
    dispatch = str(p.get("dtype") or "bf16").split(" ")[0].lower()
    if dispatch == "fp16":
        dispatch = "bf16"
    if dispatch not in alltoall.DISPATCH_BYTES:
        return None, f"dispatch format {dispatch} is not one the model knows"
    element = alltoall.DISPATCH_BYTES[dispatch]
    ops = ["dispatch", "combine"] if p.get("op") == "both" else [str(p.get("op") or "dispatch")]
    us = 0.0
    groups = int_of(p, "groups_per_token", 0)
    sms = int(num(p, "sms") or 0)  # the kernel's SM budget where the source states it
    for op in ops:
        fmt = dispatch if op == "dispatch" else "bf16"  # combine is BF16 (`alltoall.FP8_DISPATCH_BYTES`)
        us += gangs.a2a(gpu, int(ep), int(tokens), int(hidden), int(topk), fmt, mode, link, reach, gbps, groups, sms,
                        experts=experts, dispatch=op == "dispatch")["us"]
    us += host_launches_us(p)
    unit = p["unit"]
    if unit == "us":
        return us, ""
    if unit in ("GB/s", "GB/s-bottleneck"):
        size = element if ops == ["dispatch"] else 2.0
        return counted_bytes(p, int(ep), int(tokens), int(hidden), int(topk), size, per_node) / (us * 1e-6) / 1e9, ""
    return None, f"no prediction for an all-to-all in {unit}"


def counted_bytes(p: dict[str, Any], ep: int, tokens: int, hidden: int, topk: int, element: float,
                  per_node: int) -> float:
    """The bytes a source divides by the kernel's time, by its `count` convention (module
    docstring); without one: nodes-touched across nodes, rows-received inside one."""
    count = p.get("count") or ("rows-received" if ep <= per_node else "nodes-touched")
    token = tokens * hidden * element
    if count == "rows-received":
        return token * a2akernels.expected_ranks(ep, topk)
    domains = max(1, ep // per_node)
    groups = int_of(p, "groups_per_token", 0)
    remote = alltoall.remote_domains(domains, topk, groups)
    if count == "remote-nodes":
        return token * remote
    if count == "pairs":
        return token * topk
    # nodes-touched: the remote nodes and its own (which every token of DeepSeek's routing touches
    # with probability that of picking any expert there)
    own = 1.0 - (1.0 - 1.0 / domains) ** topk if domains > 1 else 1.0
    return token * (remote + own)


def pd_ttft_ms(p: dict[str, Any], model: str, gpu: str) -> float:
    """A disaggregated TTFT: the prefill on the prefill replica as its engine runs it (`engine_chunk`,
    `engine_nvls`; the prompt with the chat template's tokens around it,
    `template_tokens`), its KV over the network to the decode replica (each TP rank over its own
    NIC), the decode's first step, the measured system's PD path (`VLLM_PD_PATH_MS`) and its
    servers' tokenization of the prompt (`prompttext.tokenizations`)."""
    weights, kv_dtype = dtypes_of(p)
    tp, tokens = int_of(p, "tp", 1), int_of(p, "tokens", 1) + int_of(p, "template_tokens", 0)
    pre = cost.prefill(model, gpu, tp, tokens, 0, weights, kv_dtype=kv_dtype, chunk=engine_chunk(p, gpu),
                       nvls=engine_nvls(p))["ms"]
    kv = cost.kv(model, tokens, link_of(p), num(p, "gbps"), tp, _nics(p))["ms"]
    first = cost.decode(model, gpu, tp, 1, tokens, weights, kv_dtype=kv_dtype)["ms"]
    return float(pre + kv + first + VLLM_PD_PATH_MS) + prompt_text_ms(p, tokens)


VLLM_BIG_GPU_GIB = 70
"""vLLM's V1 engine (chunked prefill always on) budgets `max_num_batched_tokens` by the GPU when
the flag is not given: for the OpenAI API server 8192 tokens a step on a part with at least 70 GiB
that is not an A100, else 2048 (vllm-project/vllm vllm/engine/arg_utils.py as of v0.11, the source
that deprecates `disable_log_requests` for v0.12: `EngineArgs._set_default_args`, 'For GPUs like
H100 and MI300x, use larger default values', the A100 kept small after vLLM PR #17885; later
moved to `get_batch_defaults` unchanged)."""


def engine_chunk(p: dict[str, Any], gpu: str) -> int:
    """The tokens a step of the point's engine prefills at most: the point's `chunk` (0: chunked
    prefill off), else vLLM's default for the part (`VLLM_BIG_GPU_GIB`), else one step."""
    stated = num(p, "chunk")
    if stated is not None:
        return int(stated)
    if "vllm" not in str(p.get("framework") or "").lower():
        return 0
    big = catalog.gpu(gpu).memory_gb * 1e9 >= VLLM_BIG_GPU_GIB * 2**30 and not gpu.startswith("a100")
    return 8192 if big else 2048


def engine_nvls(p: dict[str, Any]) -> bool:
    """Whether the point's engine lets NCCL run NVLS all-reduces (`costmodel.LinkCost.nvls`).
    SGLang does not: it starts NCCL with NCCL_NVLS_ENABLE=0 and NCCL_CUMEM_ENABLE=0 (which NVLS
    needs) unless --enable-nccl-nvls / --enable-symm-mem (sgl-project/sglang
    python/sglang/srt/entrypoints/engine.py `_set_envs_and_config`), so its TP all-reduces run
    rings. vLLM forced NCCL_CUMEM_ENABLE=0 too until vllm-project/vllm#24141 (opened 2025-09-03,
    merged) dropped it, so NCCL's tuner may pick NVLS under vLLM 0.11."""
    return "sglang" not in str(p.get("framework") or "").lower()


fitted.apply(module=sys.modules[__name__], name="predict")  # `VLLM_PD_PATH_MS` at its shipped fit
