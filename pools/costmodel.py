"""The analytic cost model: one physics for the planner, the simulated engine and the simulator.

Prefill of n tokens on TP=t:
    compute   (2 * P_active * n + 2 * L * n^2 * H) / (t * F * mfu)      (dense + causal attention)
    comm      L * 2 ring all-reduces of n * H * 2 bytes over the group's bottleneck link
Decode step, batch b, total context C tokens:
    memory    (W / t + KV(C) / t) / (HBM * mbu)        (weights and cache read once per step)
    compute   2 * P_active * b / (t * F * mfu)          (the step takes the larger of the two)
    comm      L * 2 ring all-reduces of b * H * 2 bytes (small: latency-dominated)
    overhead  a fixed per-step cost (scheduling, sampling, kernel launches)
Ring all-reduce of m bytes on t GPUs:  2 (t-1)/t * m / B  +  2 (t-1) * alpha
KV transfer of n tokens: KV(n) / path bandwidth + path latency.

Link health is already in the path: a degraded link carries less bandwidth and more latency
(`topology.Link.effective_*`). The efficiency constants are calibrated against the published
measurements cited in tests/unit/test_costmodel.py, within the bands stated there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pools.catalog import GpuSpec, ModelSpec
from topology import GpuRef, LinkKind, Path, Topology, bottleneck
from topology.kinds import DEFAULTS

BF16 = 2
MIN_GB_S = 0.01
"""Floor for a path's bandwidth: a dead link is very slow, not a division by zero."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Efficiency:
    prefill_mfu: float = 0.62
    """Share of peak tensor FLOPs a long prefill reaches (fits TRT-LLM and LMDeploy TTFTs)."""
    decode_mbu: float = 0.75
    """Share of peak HBM bandwidth a decode step reaches (gpt-fast saw ~1700 of 2039 GB/s)."""
    decode_mfu: float = 0.35
    step_overhead_ms: float = 1.0
    """Per decode step: scheduler, sampling, kernel launches."""
    allreduce_fixed_us: float = 15.0
    """Per all-reduce cost on top of link latency: NCCL launch and sync (small all-reduces
    measured ~6 us on H100 NVLink with CUDA graphs, ~20 us on PCIe switches)."""


DEFAULT = Efficiency()


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkCost:
    """The TP group's bottleneck link (per direction)."""

    bandwidth_gb_s: float
    latency_us: float

    @classmethod
    def of(cls, path: Path) -> LinkCost:
        return cls(bandwidth_gb_s=path.bandwidth_gb_s, latency_us=path.latency_us)


LOCAL = LinkCost(bandwidth_gb_s=float("inf"), latency_us=0.0)
TP_LINK_FALLBACK = LinkCost(bandwidth_gb_s=DEFAULTS[LinkKind.NVSWITCH].bandwidth_gb_s,
                            latency_us=DEFAULTS[LinkKind.NVSWITCH].latency_us)
"""A TP group's bottleneck when no topology knows its GPUs: placement keeps a TP group inside one
NVLink island (DESIGN.md), so the island's default link (topology.kinds: H100 SXM NVSwitch,
18 x 25 = 450 GB/s per direction, 0.5 us)."""
KV_SAME_NODE_FALLBACK = Path(kind=LinkKind.NVSWITCH, tier="nvlink", bandwidth_gb_s=DEFAULTS[LinkKind.NVSWITCH]
                             .bandwidth_gb_s, latency_us=DEFAULTS[LinkKind.NVSWITCH].latency_us,
                             via="assumed: one NVLink island")
"""The KV path between two replicas on one node when no topology knows their GPUs: the node's
NVLink island (the default HGX machine, topology.kinds NVSWITCH)."""
KV_CROSS_NODE_FALLBACK = Path(kind=LinkKind.RDMA, tier="rdma", bandwidth_gb_s=DEFAULTS[LinkKind.RDMA].bandwidth_gb_s,
                              latency_us=DEFAULTS[LinkKind.RDMA].latency_us, via="assumed: one RDMA NIC pair")
"""... on other (or unnamed) nodes: one RDMA NIC pair (topology.kinds RDMA: InfiniBand NDR,
50 GB/s, 3 us)."""

TIER_QUALITY = {"local": 1.0, "nvlink": 1.0, "pcie": 0.45, "numa": 0.3, "rdma": 0.2, "tcp": 0.08, "rack": 0.05}
"""How good a TP group's tier is, in [0, 1] (the placement score and the router's
link-tier-scorer). Inside a node it is this cost model's own ratio: a prefill of 8192 tokens of
llama-3.1-8b at TP=2 on H100 runs 0.42x (NODE) to 0.51x (PIX) as fast over the PCIe default
links as over NVSwitch, and 0.32x over the cross-socket (SYS) one (topology.kinds defaults;
tests/unit/test_routing_costs.py checks it). Across nodes it is held below that ratio (by the
same measure rdma 0.63, tcp 0.28): a TP group spread over nodes also shares their NICs with KV
transfers and other traffic, and is lost with either node."""


def allreduce_ms(message_bytes: float, tp: int, link: LinkCost, eff: Efficiency = DEFAULT) -> float:
    if tp <= 1:
        return 0.0
    transfer_s = 2 * (tp - 1) / tp * message_bytes / (max(link.bandwidth_gb_s, MIN_GB_S) * 1e9)
    latency_s = 2 * (tp - 1) * link.latency_us * 1e-6 + eff.allreduce_fixed_us * 1e-6
    return (transfer_s + latency_s) * 1e3


def collective_ms(op: str, message_bytes: float, gpus: int, link: LinkCost, eff: Efficiency = DEFAULT) -> float:
    """One collective of `message_bytes` per GPU (nccl-tests' size) over `gpus` ranks, as a ring:
    all-reduce moves 2(k-1)/k of it per GPU over 2(k-1) hops, all-gather and reduce-scatter
    (k-1)/k over k-1 hops, all-to-all (k-1)/k in one exchange; plus NCCL's fixed cost per call."""
    if op == "allreduce":
        return allreduce_ms(message_bytes, gpus, link, eff)
    if gpus <= 1:
        return 0.0
    hops = 1 if op == "alltoall" else gpus - 1
    transfer_s = (gpus - 1) / gpus * message_bytes / (max(link.bandwidth_gb_s, MIN_GB_S) * 1e9)
    return (transfer_s + (hops * link.latency_us + eff.allreduce_fixed_us) * 1e-6) * 1e3


def prefill_ms(model: ModelSpec, gpu: GpuSpec, tp: int, link: LinkCost, tokens: int,
               eff: Efficiency = DEFAULT, context_tokens: int = 0) -> float:
    """`tokens` new prompt tokens after `context_tokens` already in the cache (a later chunk of a
    chunked prefill, or a prefix-cache hit): the weights' FLOPs for the new tokens, and attention
    of each new token over the cached ones and the new ones before it (4 x layers x hidden FLOPs
    per query-key pair: QK^T and AV, 2 FLOPs per multiply-add)."""
    n = max(tokens, 1)
    c = max(context_tokens, 0)
    pairs = n * n / 2 + n * c
    flops = 2 * model.active_params_b * 1e9 * n + 4 * model.layers * pairs * model.hidden
    compute_s = flops / (tp * gpu.bf16_tflops * 1e12 * eff.prefill_mfu)
    comm_ms = model.layers * 2 * allreduce_ms(n * model.hidden * BF16, tp, link, eff)
    return compute_s * 1e3 + comm_ms


def decode_step_ms(model: ModelSpec, gpu: GpuSpec, tp: int, link: LinkCost, batch: int,
                   context_tokens: int, eff: Efficiency = DEFAULT) -> float:
    return DecodeStep.of(model, gpu, tp, link, batch, eff).ms(context_tokens)


@dataclass(frozen=True, slots=True)
class DecodeStep:
    """A decode step's cost for a fixed batch, as a function of the context it reads (the
    simulator evaluates it for hundreds of consecutive steps)."""

    weights_bytes: float
    kv_per_token: float
    tp: int
    hbm_bytes_s: float
    compute_s: float
    fixed_ms: float

    @classmethod
    def of(cls, model: ModelSpec, gpu: GpuSpec, tp: int, link: LinkCost, batch: int,
           eff: Efficiency = DEFAULT) -> DecodeStep:
        b = max(batch, 1)
        compute_s = 2 * model.active_params_b * 1e9 * b / (tp * gpu.bf16_tflops * 1e12 * eff.decode_mfu)
        comm_ms = model.layers * 2 * allreduce_ms(b * model.hidden * BF16, tp, link, eff)
        return cls(weights_bytes=model.weights_gb * 1e9 / tp, kv_per_token=model.kv_bytes_per_token(), tp=tp,
                   hbm_bytes_s=gpu.hbm_gb_s * 1e9 * eff.decode_mbu, compute_s=compute_s,
                   fixed_ms=comm_ms + eff.step_overhead_ms)

    def ms(self, context_tokens: int) -> float:
        memory_s = (self.weights_bytes + self.kv_per_token * context_tokens / self.tp) / self.hbm_bytes_s
        return max(memory_s, self.compute_s) * 1e3 + self.fixed_ms


def kv_bytes(model: ModelSpec, tokens: int) -> float:
    return model.kv_bytes_per_token() * tokens


def kv_transfer_ms(model: ModelSpec, tokens: int, path: Path) -> float:
    if path.tier == "local":
        return 0.0
    return kv_bytes(model, tokens) / (max(path.bandwidth_gb_s, MIN_GB_S) * 1e9) * 1e3 + path.latency_us * 1e-3


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


def kv_handover_ms(model: ModelSpec, tokens: int, paths: Sequence[Path]) -> float:
    """KV of `tokens` moved as the engines move it: each prefill TP rank sends its shard to the
    decode rank of the same index, all at once (`paths`: one per rank pair). Pairs carried by the
    same link or NIC pair (the same `Path.via`) share its bandwidth; the slowest carrier and the
    worst latency decide. No paths, or only local ones: nothing moves."""
    ms_per_byte, latency_ms = kv_handover_rate(paths)
    return kv_bytes(model, tokens) * ms_per_byte + latency_ms if ms_per_byte else 0.0


def kv_handover_rate(paths: Sequence[Path]) -> tuple[float, float]:
    """`kv_handover_ms` as (ms per byte of the whole KV, latency ms): a function of the paths
    alone, so a router can remember it per replica pair."""
    moving = [p for p in paths if p.tier != "local"]
    if not moving:
        return 0.0, 0.0
    carried: dict[str, tuple[int, float]] = {}
    for p in moving:
        count, bandwidth = carried.get(p.via, (0, p.bandwidth_gb_s))
        carried[p.via] = (count + 1, min(bandwidth, p.bandwidth_gb_s))
    share = 1.0 / len(paths)
    slowest_s = max(count * share / (max(bandwidth, MIN_GB_S) * 1e9) for count, bandwidth in carried.values())
    return slowest_s * 1e3, max(p.latency_us for p in moving) * 1e-3


def weights_per_gpu_gb(model: ModelSpec, tp: int) -> float:
    return model.weights_gb / tp


def kv_capacity_tokens(model: ModelSpec, gpu: GpuSpec, tp: int, memory_utilization: float = 0.9,
                       activation_reserve_gb: float = 2.0) -> int:
    """Tokens of KV cache the replica can hold (vLLM's gpu_memory_utilization semantics)."""
    free_gb = gpu.memory_gb * memory_utilization - weights_per_gpu_gb(model, tp) - activation_reserve_gb
    if free_gb <= 0:
        return 0
    return int(free_gb * 1e9 * tp / model.kv_bytes_per_token())


def fits(model: ModelSpec, gpu_memory_gb: float, tp: int, memory_utilization: float = 0.9,
         min_kv_tokens: int = 4096) -> bool:
    """Weights fit with room for at least `min_kv_tokens` of cache (one long request)."""
    free_gb = gpu_memory_gb * memory_utilization - weights_per_gpu_gb(model, tp) - 2.0
    return free_gb * 1e9 * tp >= min_kv_tokens * model.kv_bytes_per_token()
