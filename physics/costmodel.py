"""The analytic cost model: one physics for the planner, the simulated engine and the simulator.
Every constant names the published measurement that sets it (physics/data/calibration.yaml holds
the points; `python -m pools fidelity` prints model against measurement).

A forward pass (one engine step) of T tokens on TP=t: prefill chunks (n new tokens after c
cached ones each) and decodes (one token each, reading their context):
    compute   (2 P_body T + 2 V H S) / (t F mfu)  +  attention over sum of (n^2/2 + n c) pairs
              (`physics.flops`: the body for every token, the LM head (V x H) for the S sequences
              sampled, the embedding a gather; each sequence's causal attention over its context)
    memory    (W / t + KV(all contexts read) / t) / (HBM mbu)       (weights read once per step)
    time      roof(compute, memory)  +  a per-step constant  +  2 L all-reduces of T H 2 bytes
              +  the norms and residual adds every rank runs on the whole hidden (`replicated_ms`)
              (a decode-only step: roof(compute, W read) + KV read, `DecodeStep.ms`; roof is
              (compute^1.5 + memory^1.5)^(1/1.5), not their max: `GEMM_CORNER`)
F is the FP8 rate for FP8 weights on parts that have one. The per-step constant is a decode
step's CUDA-graph replay, scheduling and sampling, or, for a step with prefill in it (run
eagerly), a launch cost per layer. Prefill-decode interference follows: a decode step that shares
the GPU with a prefill chunk takes the chunk's compute time (Sarathi-Serve's hybrid batches).

All-reduces are priced as NCCL prices them (`physics.collectives`: ring / tree / NVLS, LL / LL128 /
Simple, bus efficiency below the line). Moving a KV cache between replicas is priced in
`physics.kvtransfer`.

Link health is already in the path: a degraded link carries less bandwidth and more latency
(`topology.Link.effective_*`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from physics.catalog import GpuSpec, ModelSpec
from physics.collectives import NVLS_HOPPER, Hw, collective_us
from physics.flops import attention_s, step_flops
from topology import GpuRef, LinkKind, Path, Topology, bottleneck
from topology.kinds import DEFAULTS

BF16 = 2

GEMM_CORNER = 1.5
"""How a kernel's compute and memory bounds combine: (compute^n + memory^n)^(1/n) with n = 1.5,
not max(compute, memory). Near the roofline's ridge a GEMM reaches neither roof (its tiles wait on
weight loads that its tensor cores cannot hide): max() prices it up to 1.5x too fast there.
Chosen on kernel profiles, not fitted to the published points: microsoft/vidur
@7d47513363ec447a741ac5e47241580b47724fbf data/profiling/compute/{a100,h100}/*/mlp.csv
(sarathi-serve's kernels; the four projections' GPU time per layer, 8 models, TP 1-8, 1-32K
tokens; the 7,566 rows whose weight read takes 0.15 ms or more). With compute at the long-prompt
plateau (0.73 of peak on A100, 0.71 on H100, the medians over the models) and memory at the parts'
measured shares: max() reads 0.66x of the measured time where compute and memory are equal and
0.92x over all rows. On a 0.1 grid, n = 1.5 has the smallest mean bias (1.00x over all rows, |log|
rms 0.068; 1.4 ties it on rms, 1.6 is worse) and reads within 8 % in every half-octave of
compute/memory centred on powers of the square root of 2 (H100 alone: up to 15 % just below the
ridge); one model against its own plateau can read 15-19 % slow near 256 tokens (Llama-2-7B on
A100). The model applies it at its own rates (memory at the fitted serving share, compute at the
fitted MFU), so its ridge sits near, not on, the profile's."""


def roofline_s(compute_s: float, memory_s: float) -> float:
    """A kernel's time from its compute-bound and memory-bound times (`GEMM_CORNER`)."""
    if compute_s <= 0.0 or memory_s <= 0.0:
        return max(compute_s, memory_s, 0.0)
    n = GEMM_CORNER
    return float((compute_s ** n + memory_s ** n) ** (1.0 / n))


@dataclass(frozen=True, slots=True, kw_only=True)
class Efficiency:
    prefill_mfu: float = 0.62
    """Share of peak BF16 tensor FLOPs a long prefill reaches: TensorRT-LLM v0.5 and LMDeploy
    LLaMA-2 7B/70B 2048-token TTFTs on A100 (calibration points trtllm05-a100-*, lmdeploy-*-ftl)."""
    fp8_mfu: float = 0.50
    """Share of peak FP8 FLOPs: FP8 GEMMs reach less of their (doubled) peak. NIM 1.8 Llama-3.3-70B
    FP8 TP2 on H100, 5000-token TTFT 406.8 ms (nim-h100-llama3.3-70b-tp2-fp8-p5000)."""
    decode_mbu: float = 0.974
    """Share of what a memory-bound kernel reaches on the part (`GpuSpec.memory_gb_s`: the data
    sheet's bandwidth times its measured share, 0.77 on A100, 0.80 on H100) that a decode step reads
    at: 0.75 of A100's data sheet (gpt-fast saw ~1700 of 2039 GB/s; LMDeploy LLaMA-2-7B batch-1
    per-token latency 9 ms on A100: lmdeploy-a100-llama2-7b-b1-*), 0.78 of H100's."""
    decode_mfu: float = 0.35
    step_overhead_ms: float = 1.0
    """Per decode step: CUDA-graph replay, scheduler, sampling."""
    decode_layer_overhead_ms: float = 0.0
    """Per layer of a decode step: the layer's kernels run one after another even from a CUDA
    graph, each a few microseconds however small the batch (an MLA + MoE layer is a score of
    kernels). Its prior is 0 (the calibration set's decode steps are folded into
    `step_overhead_ms`); the fit frees it (`physics.fitted`)."""
    attention_mfu: float = 0.95
    """Share of peak BF16 a prefill attention kernel's QK and PV matmuls reach, its exponentials
    apart (`physics.flops.attention_s`: FlashAttention-3's H100 rates within 3 %). Not fitted: the
    kernel's own benchmark measures it (loadtest/fidelity/constants.py says why)."""
    seq_overhead_ms: float = 0.0
    """Per sequence of a decode step beyond `step_overhead_ms` (host-side sampling per sequence):
    0 here; the DistServe replay's vLLM 0.1.7 sets it (`loadtest.fidelity.replay.overheads`)."""
    prefill_layer_overhead_ms: float = 0.13
    """Per layer of a step that prefills (run eagerly, not from a CUDA graph: kernel launches and
    the small GEMMs' ramp): TensorRT-LLM v0.5 LLaMA-7B FP8 on H100 takes 7 ms for 128 tokens,
    where compute and weight reads are 2.7 ms (trtllm05-h100-llama2-7b-p128); 32 layers."""


DEFAULT = Efficiency()

LINK_HW: dict[LinkKind, Hw] = {LinkKind.NVSWITCH: "nvlink", LinkKind.NVLINK: "nvlink", LinkKind.XGMI: "nvlink",
                               LinkKind.RDMA: "net", LinkKind.TCP: "net"}
"""NCCL's hardware class of a link kind (tuning.cc: NVLink, PCI, network); PCIe kinds are PCI."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkCost:
    """The TP group's bottleneck link (per direction) and how NCCL would use it."""

    bandwidth_gb_s: float
    latency_us: float
    hw: Hw = "nvlink"
    switched: bool = False
    """An NVSwitch (NVLS all-reduce possible when the GPU has it)."""
    nvls: bool = True
    """The engine lets NCCL run NVLS all-reduces (False: rings; SGLang's NCCL_NVLS_ENABLE=0,
    `loadtest.fidelity.predict.engine_nvls`)."""

    @classmethod
    def of(cls, path: Path) -> LinkCost:
        return cls(bandwidth_gb_s=path.bandwidth_gb_s, latency_us=path.latency_us, hw=LINK_HW.get(path.kind, "pci"),
                   switched=path.kind is LinkKind.NVSWITCH)


LOCAL = LinkCost(bandwidth_gb_s=float("inf"), latency_us=0.0)
TP_LINK_FALLBACK = LinkCost(bandwidth_gb_s=DEFAULTS[LinkKind.NVSWITCH].bandwidth_gb_s,
                            latency_us=DEFAULTS[LinkKind.NVSWITCH].latency_us, switched=True)
"""A TP group's bottleneck when no topology knows its GPUs: placement keeps a TP group inside one
NVLink island (DESIGN.md), so the island's default link (topology.kinds: H100 SXM NVSwitch,
18 x 25 = 450 GB/s per direction, 0.5 us)."""
TIER_QUALITY = {"local": 1.0, "nvlink": 1.0, "pcie": 0.42, "numa": 0.3, "rdma": 0.2, "tcp": 0.08, "rack": 0.05}
"""How good a TP group's tier is, in [0, 1] (the placement score and the router's
link-tier-scorer). Inside a node it is this cost model's own ratio: a prefill of 8192 tokens of
llama-3.1-8b at TP=2 on H100 runs 0.34x (NODE) to 0.43x (PIX) as fast over the PCIe default
links as over NVSwitch, and 0.25x over the cross-socket (SYS) one (topology.kinds defaults;
tests/physics/test_routing_costs.py checks it). Across nodes it is held below that ratio (by the
same measure rdma 0.56, tcp 0.23): a TP group spread over nodes also shares their NICs with KV
transfers and other traffic, and is lost with either node."""


def allreduce_ms(message_bytes: float, tp: int, link: LinkCost, gpu: GpuSpec | None = None) -> float:
    """One all-reduce of a TP group over its bottleneck link (`physics.collectives`); a group
    whose bottleneck is a network spans two nodes, the link being the one NIC path between them."""
    if tp <= 1 or link.bandwidth_gb_s == float("inf"):
        return 0.0
    nvls = link.switched and link.nvls and gpu is not None and gpu.nvls
    if link.hw == "net":
        return collective_us("allreduce", message_bytes, tp, TP_LINK_FALLBACK.bandwidth_gb_s, "net", nodes=2,
                             node_gb_s=link.bandwidth_gb_s, net_latency_us=link.latency_us,
                             library=gpu.collectives if gpu is not None else "nccl") / 1e3
    return collective_us("allreduce", message_bytes, tp, link.bandwidth_gb_s, link.hw, nvls=nvls,
                         nvls_efficiency=gpu.nvls_efficiency if gpu is not None else NVLS_HOPPER) / 1e3


def prefill_ms(model: ModelSpec, gpu: GpuSpec, tp: int, link: LinkCost, tokens: int,
               eff: Efficiency = DEFAULT, context_tokens: int = 0, *, ep: int = 1) -> float:
    """`tokens` new prompt tokens after `context_tokens` already in the cache (a later chunk of a
    chunked prefill, or a prefix-cache hit), alone in a step."""
    return forward_ms(model, gpu, tp, link, ((max(tokens, 1), max(context_tokens, 0)),), 0, 0, eff, ep=ep)


def forward_ms(model: ModelSpec, gpu: GpuSpec, tp: int, link: LinkCost, chunks: Sequence[tuple[int, int]],
               decodes: int, decode_context: int, eff: Efficiency = DEFAULT, *, ep: int = 1) -> float:
    """One engine step (module docstring): prefill `chunks` as (new tokens, cached tokens before
    them) and `decodes` sequences with `decode_context` tokens of context in all. `ep` > 1: the
    step of one data-parallel rank (of `tp` GPUs) of an expert-parallel gang of `ep` such ranks,
    each carrying the same load, its experts a 1/ep share (`weights_read_bytes`; the all-to-all
    is `physics.moecost`'s, not priced here)."""
    if not chunks:
        return DecodeStep.of(model, gpu, tp, link, decodes, eff, ep=ep).ms(decode_context) if decodes else 0.0
    compute_s, memory_s = step_roofs(model, gpu, tp, chunks, decodes, decode_context, eff, ep=ep)
    new = float(sum(n for n, _ in chunks))
    comm_ms = model.layers * 2 * allreduce_ms((new + decodes) * model.hidden * BF16, tp, link, gpu)
    return (roofline_s(compute_s, memory_s) * 1e3 + replicated_ms(model, gpu, new)
            + model.layers * eff.prefill_layer_overhead_ms + comm_ms)


def step_roofs(model: ModelSpec, gpu: GpuSpec, tp: int, chunks: Sequence[tuple[int, int]], decodes: int,
               decode_context: int, eff: Efficiency = DEFAULT, *, ep: int = 1) -> tuple[float, float]:
    """A step with prefill `chunks`' (`forward_ms`) compute-bound and memory-bound times in seconds,
    which `roofline_s` combines."""
    new = pairs = cached = 0.0
    for n, c in chunks:
        new += n
        pairs += n * n / 2 + n * c
        cached += c
    tokens = new + decodes
    flops = step_flops(model, tokens, len(chunks) + decodes)
    rate = gpu.tflops(model.compute) * 1e12 * (eff.fp8_mfu if gpu.low_precision(model.compute) else eff.prefill_mfu)
    compute_s = flops / (tp * rate) + attention_s(model, gpu, pairs, eff.attention_mfu) / tp
    weights = weights_read_bytes(model, tokens, ep)
    memory_s = (weights + model.kv_bytes_per_token() * (cached + decode_context)) / (
        tp * gpu.memory_gb_s * 1e9 * eff.decode_mbu) + dequant_s(model, gpu, weights) / tp
    return compute_s, memory_s


REPLICATED_HIDDEN_PASSES = 12.2
"""What a step's replicated per-token kernels cost, in passes over one prompt token's BF16 hidden
vector per layer at the rate a memory-bound kernel reaches on the part (`GpuSpec.kernel_gb_s`: its
data sheet times its measured share): the two RMSNorms and the residual add run on the whole hidden
on every TP rank (only the GEMMs, rope and the activation are split), so TP does not shorten them.
Measured, not fitted: microsoft/vidur @7d47513363ec447a741ac5e47241580b47724fbf
data/profiling/compute/{a100,h100}/*/mlp.csv (sarathi-serve's kernels, GPU kernel time per layer),
input_layernorm + post_attention_layernorm + add at 512-4096 tokens: 15-16 hidden-vector passes per
token at the data sheet's rate on A100 and H100 alike, flat from TP1 to TP8 and across hidden
4096-8192 (Llama-2-7B at 4096 tokens on H100: 0.162 ms a layer at TP8 against 0.165 at TP1); at
their measured shares (0.77 and 0.80) 11.9 and 12.4 passes. At TP8 on an 8B model that is ~1.4 us
a prompt token, a fifth of the step. Below ~256 tokens each kernel sits at a launch floor instead,
which `Efficiency.prefill_layer_overhead_ms` carries. A decode token's norms are not priced here:
a decode-only step (`DecodeStep`) holds them in its fitted per-step and per-layer constants, so a
step that mixes decodes into a prefill prices them the same way."""


def replicated_ms(model: ModelSpec, gpu: GpuSpec, tokens: float) -> float:
    """The norms and residual adds of a step's `tokens` prompt tokens (`REPLICATED_HIDDEN_PASSES`),
    the same on every TP rank."""
    return tokens * model.layers * REPLICATED_HIDDEN_PASSES * model.hidden * BF16 / (gpu.kernel_gb_s * 1e9) * 1e3


def decode_step_ms(model: ModelSpec, gpu: GpuSpec, tp: int, link: LinkCost, batch: int,
                   context_tokens: int, eff: Efficiency = DEFAULT, *, ep: int = 1) -> float:
    return DecodeStep.of(model, gpu, tp, link, batch, eff, ep=ep).ms(context_tokens)


@dataclass(frozen=True, slots=True)
class DecodeStep:
    """A decode-only step's cost for a fixed batch, as a function of the context it reads (the
    simulator evaluates it for hundreds of consecutive steps): `forward_ms` without chunks."""

    weights_bytes: float
    kv_per_token: float
    tp: int
    hbm_bytes_s: float
    compute_s: float
    fixed_ms: float
    gemms_s: float
    """The GEMMs: `compute_s` and the weight read through the roofline's corner (`roofline_s`),
    the same at every context, so worked out once."""

    @classmethod
    def of(cls, model: ModelSpec, gpu: GpuSpec, tp: int, link: LinkCost, batch: int,
           eff: Efficiency = DEFAULT, *, ep: int = 1) -> DecodeStep:
        return _decode_step(model, gpu, tp, link, max(batch, 1), eff, max(ep, 1))

    def ms(self, context_tokens: int) -> float:
        """The GEMMs (weights read and FLOPs through the roofline's corner, `roofline_s`) plus the
        attention's KV read:
        qkv_proj, rope, attention, o_proj run one kernel after another (vllm-project/vllm
        vllm/model_executor/models/llama.py @0035bdf2b1ac243ef6f31eef27411b022461df8e,
        LlamaAttention.forward): a large batch at long context pays both, the KV read never
        hidden under the GEMMs' compute."""
        kv_s = self.kv_per_token * context_tokens / self.tp / self.hbm_bytes_s
        return (self.gemms_s + kv_s) * 1e3 + self.fixed_ms


@functools.lru_cache(maxsize=16384)
def _decode_step(model: ModelSpec, gpu: GpuSpec, tp: int, link: LinkCost, b: int, eff: Efficiency,
                 ep: int = 1) -> DecodeStep:
    compute_s = step_flops(model, b, b) / (tp * gpu.tflops(model.compute) * 1e12 * eff.decode_mfu)
    comm_ms = model.layers * 2 * allreduce_ms(b * model.hidden * BF16, tp, link, gpu)
    weights = weights_read_bytes(model, b, ep)
    hbm_bytes_s = gpu.memory_gb_s * 1e9 * eff.decode_mbu
    memory_s = (weights / hbm_bytes_s + dequant_s(model, gpu, weights)) / tp
    return DecodeStep(weights_bytes=weights / tp, kv_per_token=model.kv_bytes_per_token(), tp=tp,
                      hbm_bytes_s=hbm_bytes_s, compute_s=compute_s,
                      fixed_ms=comm_ms + eff.step_overhead_ms + model.layers * eff.decode_layer_overhead_ms
                      + b * eff.seq_overhead_ms, gemms_s=roofline_s(compute_s, memory_s))


def expected_experts(experts: int, per_token: int, tokens: float, skew: float = 0.0) -> float:
    """Distinct experts of one layer that `tokens` tokens pick, `per_token` each, out of
    `experts`. Uniform routing (`skew` 0): E (1 - (1 - k/E)^T). Skewed routing: expert i is picked
    with probability proportional to 1 / i^skew (Zipf), each of the T k choices independent:
    sum over i of 1 - (1 - p_i)^(T k). Skew makes a batch touch fewer experts."""
    if experts <= 0 or tokens <= 0:
        return 0.0
    k = min(per_token, experts)
    if skew <= 0:
        return experts * (1.0 - math.pow(1.0 - k / experts, tokens))
    weights = [math.pow(i + 1.0, -skew) for i in range(experts)]
    total = sum(weights)
    draws = tokens * k
    return sum(1.0 - math.pow(1.0 - min(w / total, 1.0), draws) for w in weights)


WEIGHT_ONLY_DEQUANT_FLOPS = 3.5
"""What dequantising a weight costs a weight-only GEMV (INT4/INT8, and FP8/FP4 on parts without
those tensor cores), in operations per weight at the part's FP32 rate (`GpuSpec.fp32_tflops`),
added to its memory time: the kernel reads fewer bytes but unpacks, converts and scales every
weight on the SMs' ALUs, not the tensor cores, so what it costs follows the part's ALU rate, not
its bandwidth. The rate is also scaled by the part's serving share (`GpuSpec.serving_share`):
empirically, not as a mechanism. Without it the two sources below disagreed held out (gpt-fast's
rows 0.65-0.77, Qwen3's 1.13-1.16); with it they read as the bytes form did (0.77-0.89,
0.98-1.03). It puts the effective rate above the data sheet's FP32 peak where the share is above
1 (A100 23 of 19.5 TFLOPS): the constant is an effective operation count, not an instruction
count. On those two sources the share cancels out of dequantisation over read time, so there
this form is the bytes form; a part whose FP32 rate per byte of bandwidth differs tells them
apart (RTX 4090: 8.6x A100's in FP32, 4.3x in INT32, which AWQ-style unpacking mostly runs on).

The prior: gpt-fast's int8/int4 rows on A100 and Qwen3's AWQ-INT4 rows on H20
(physics/data/published/serving.yaml GPTFAST, QWEN3-SPEED), against their BF16 rows on the same
machine, read as 0.27 bytes of memory time per weight at those parts' measured bandwidths (the
form this cost took until 2026-12-07): 3.4 and 3.8 FP32 operations per weight at their FP32 rates
(19.5 and 44 TFLOPS beside 2.0 and 4.0 TB/s). Fitted with the rest (physics/data/fitted.yaml).

Priced once per weight per step: every weight-only point is a batch-1 decode; kernels that
dequantise per row tile pay more at large batches and in prefill (there it sits under the compute
roof). Dense weights only: `moecost` prices no dequantisation for weight-only experts."""


def dequant_s(model: ModelSpec, gpu: GpuSpec, weight_bytes: float) -> float:
    """Seconds of ALU time a weight-only format adds to reading `weight_bytes` of its weights on
    this GPU (0: the format has no dequantisation here: BF16, or a rate the part's tensor cores
    run natively). Refused for a part whose FP32 rate is not known."""
    if model.weight_bytes >= 2 or gpu.low_precision(model.compute):
        return 0.0
    if not gpu.fp32_tflops:
        raise ValueError(f"{gpu.name}: no fp32_tflops in gpus.yaml, so a weight-only format's dequantisation "
                         f"cannot be priced on it")
    ops = weight_bytes / model.weight_bytes * WEIGHT_ONLY_DEQUANT_FLOPS
    return ops / (gpu.fp32_tflops * 1e12 * gpu.serving_share)


def weights_read_bytes(model: ModelSpec, tokens: float, ep: int = 1) -> float:
    """Bytes of weights a step of `tokens` tokens reads: every dense weight (attention, dense
    FFNs, shared experts, the LM head) but an untied input embedding (a gather: a row per token,
    `physics.flops`), and of the routed experts only those some token of
    the step picked (`expected_experts`, with the model's routing skew): a small MoE decode batch
    reads a few experts per layer, a large one all of them. `ep` > 1: one data-parallel rank of
    an expert-parallel gang whose `ep` ranks each bring `tokens`; the rank (its TP group) holds
    1/ep of the experts."""
    moe = model.moe
    gathered = model.embedding_params_b * 1e9 * model.weight_bytes
    if moe is None:
        return model.weights_gb * 1e9 - gathered
    ep = max(ep, 1)
    touched = expected_experts(moe.routed_experts, moe.experts_per_token, max(tokens, 1.0) * ep, moe.routing_skew)
    experts = moe.moe_layers * touched / ep * moe.expert_params(model.hidden) * model.expert_bytes
    return model.dense_params_b * 1e9 * model.weight_bytes - gathered + experts


def located(topology: Topology | None, gpus: Sequence[GpuRef]) -> bool:
    """The topology knows every one of these GPUs (so paths between them can be priced)."""
    return topology is not None and bool(gpus) and all(
        topology.has_node(g.node) and topology.node(g.node).has_gpu(g.index) for g in gpus)


def group_link(topology: Topology | None, gpus: Sequence[GpuRef], tp: int) -> LinkCost:
    """The bottleneck of a TP group: the worst link among its GPUs (`topology.bottleneck`), or
    `TP_LINK_FALLBACK` when the topology does not know them."""
    if tp <= 1 or len(gpus) == 1:
        return LOCAL
    if topology is None or not located(topology, gpus):
        return TP_LINK_FALLBACK
    return LinkCost.of(bottleneck(topology, gpus))


def weights_per_gpu_gb(model: ModelSpec, tp: int, pp: int = 1, ep: int = 1) -> float:
    """One GPU's share of the weights: layers split over `pp` stages; inside a stage the routed
    experts over max(tp, ep) GPUs (expert parallelism: tp x dp), everything else over tp (each
    data-parallel rank holds its own copy)."""
    if model.moe is None:
        return model.weights_gb / (tp * pp)
    experts = model.routed_params_b * model.expert_bytes
    return (model.dense_params_b * model.weight_bytes / tp + experts / max(tp, ep)) / pp


def kv_shards(model: ModelSpec, tp: int, pp: int = 1) -> int:
    """GPUs one sequence's KV is split over: layers over stages, heads over TP, except MLA's one
    latent KV, which every TP rank keeps whole (vLLM replicates it)."""
    return (1 if model.attention == "mla" else tp) * pp


def kv_capacity_tokens(model: ModelSpec, gpu: GpuSpec, tp: int, memory_utilization: float = 0.9,
                       activation_reserve_gb: float = 2.0, pp: int = 1, ep: int = 1) -> int:
    """Tokens of KV cache the replica (one data-parallel rank of a gang) can hold (vLLM's
    gpu_memory_utilization semantics)."""
    free_gb = gpu.memory_gb * memory_utilization - weights_per_gpu_gb(model, tp, pp, ep) - activation_reserve_gb
    if free_gb <= 0:
        return 0
    return int(free_gb * 1e9 * kv_shards(model, tp, pp) / model.kv_bytes_per_token())


def fits(model: ModelSpec, gpu_memory_gb: float, tp: int, memory_utilization: float = 0.9,
         min_kv_tokens: int = 4096, pp: int = 1, ep: int = 1) -> bool:
    """Weights fit with room for at least `min_kv_tokens` of cache (one long request)."""
    free_gb = gpu_memory_gb * memory_utilization - weights_per_gpu_gb(model, tp, pp, ep) - 2.0
    return free_gb * 1e9 * kv_shards(model, tp, pp) >= min_kv_tokens * model.kv_bytes_per_token()
