"""Moving a KV cache between replicas (a prefill/decode handover, a pull of a cached prefix): the
bytes over the path at the share of its line a transfer engine reaches, plus a setup per transfer
on a network and the per-layer transfer requests each rank posts to its NIC (`kv_transfer_ms`,
`kv_handover_ms`). The paths come from `topology` (or the fallbacks below when it does not know
the GPUs); a degraded link is already slower in its path (`topology.Link.effective_*`).
"""

from __future__ import annotations

from collections.abc import Sequence

from physics.catalog import ModelSpec
from physics.collectives import BUS_EFFICIENCY
from physics.costmodel import LINK_HW
from topology import LinkKind, Path
from topology.kinds import DEFAULTS

MIN_GB_S = 0.01
"""Floor for a path's bandwidth: a dead link is very slow, not a division by zero."""
KV_SAME_NODE_FALLBACK = Path(kind=LinkKind.NVSWITCH, tier="nvlink", bandwidth_gb_s=DEFAULTS[LinkKind.NVSWITCH]
                             .bandwidth_gb_s, latency_us=DEFAULTS[LinkKind.NVSWITCH].latency_us,
                             via="assumed: one NVLink island")
"""The KV path between two replicas on one node when no topology knows their GPUs: the node's
NVLink island (the default HGX machine, topology.kinds NVSWITCH)."""
KV_CROSS_NODE_FALLBACK = Path(kind=LinkKind.RDMA, tier="rdma", bandwidth_gb_s=DEFAULTS[LinkKind.RDMA].bandwidth_gb_s,
                              latency_us=DEFAULTS[LinkKind.RDMA].latency_us, via="assumed: one RDMA NIC pair")
"""... on other (or unnamed) nodes: one RDMA NIC pair (topology.kinds RDMA: InfiniBand NDR,
50 GB/s, 3 us)."""



def kv_bytes(model: ModelSpec, tokens: int) -> float:
    return model.kv_bytes_per_token() * tokens


KV_LINE_EFFICIENCY = 0.87
"""Share of a network line a KV transfer reaches on large transfers: Mooncake's transfer engine
moved 40 GB at 87 GB/s over 4 x 200 Gb/s RoCE (calibration point mooncake-te-40GB-4x200g-roce).
Inside a node, the NVLink/PCIe share nccl-tests reach (`physics.collectives.BUS_EFFICIENCY`).
The same share holds per NIC whatever its line: with GPU buffers and 1 MB blocks the engine's EFA
transport reaches 97.5 % of 16 x 400 Gb/s on B300, 91 % of 16 x 200 Gb/s on H200 and 97 % of
32 x 100 Gb/s on H100 (kvcache-ai/Mooncake docs/source/design/transfer-engine/efa_transport.md
@3b5a594133958449a1feaf1c9e0fc1b553e34a28, 'Benchmark Results'), and SGLang's Mooncake backend
82 % of 4 x 400 GbE (docs/source/performance/sglang/sglang-benchmark-results-v1.md, same commit):
no per-NIC ceiling below the line (the 23.75 GB/s per NIC of 8 x 400 Gb/s in Mooncake's README is
the hosts' DRAM, `KV_HOST_DRAM_GB_S`)."""
KV_HOST_DRAM_GB_S = 210.0
"""What a transfer between two hosts' DRAM buffers (not GPU memory) reaches at most, whatever the
NICs: the memory, not the network, is the bound. Mooncake's EFA transport doc (commit above,
'CPU-to-CPU' tables): 'CPU-to-CPU is DRAM-bound' at 213 GB/s write on p5en (Xeon 8488C, DDR5)
and 222 GB/s on p6-b200 over 16 / 8 NICs that carry 365 / 302 GB/s GPU-to-GPU (283 GB/s on
p6-b300's Xeon 8559C; 64 GB/s on p5's DDR4 EPYC 7R13). A two-socket DDR5 server's figure; points
say `memory: dram` (transfer_engine_bench moves 'data blocks from the DRAM of the target node',
docs/source/design/transfer-engine/index.md, same commit)."""
KV_SETUP_MS = 0.1
"""Per transfer over a network: request, block-list exchange and completion notice (the
requests the engine posts per layer are `KV_LAYER_REQUEST_US`)."""
KV_LAYER_REQUEST_US = 4.5
"""Per transfer request a rank's KV connector posts to its NIC: the connectors move the KV one
layer buffer at a time, a K and a V request per layer (one latent for MLA), each a batch
transfer the engine slices, posts and polls to completion (vLLM's MooncakeConnector and SGLang's
Mooncake backend both walk the layers' KV pointers), and ranks that share a NIC queue theirs on
it. Sets the small-prompt floor of a PD KV transfer: vLLM + Mooncake moved 128 tokens of Qwen3-8B
(36 layers, 8 ranks on 8 NICs) in 0.54 ms, 0.13 of it bytes (mooncake-pd-kv-128tok); SGLang +
Mooncake 128 tokens of Qwen3-235B (94 layers, 8 ranks on 4 NICs) in 2.07 ms, 0.3 of it bytes
(mooncake-sgl-pd-h20-qwen3-235b-kv-128tok): 72 and 376 requests per NIC, ~5 us each."""
KV_EFA_OP_US = 10.2
"""What one transfer request costs its NIC under Mooncake's EFA transport (AWS EFA, SRD through
libfabric) where `KV_LAYER_REQUEST_US` is the RDMA (verbs) transport's: the EFA transport does not
slice a request, 'each transfer is sent as a single fi_write / fi_read whose size equals
block_size, round-robin'd across NICs per request', and small blocks leave the line idle behind
'per-op overhead' (kvcache-ai/Mooncake docs/source/design/transfer-engine/efa_transport.md
@3b5a594133958449a1feaf1c9e0fc1b553e34a28, 'Key Parameters' note on EFA slicing and 'block_size
sweep'). The sweep's 128 KB row (p5en, 16 x 200 Gb/s EFA, threads=16 x batch=128 = 2048 blocks in
flight, 190.82 GB/s write) is a round of 128 requests per NIC in 1.41 ms, 0.1 of it the setup
(`KV_SETUP_MS`): (1.41 - 0.1) / 128 = 10.2 us a request, the 64 KB row's round taking the same
1.38 ms (op-bound, not byte-bound) and the 256 KB row's the wire's. A property of the transport,
not of the GPU or NIC rate."""
KV_BLOCK_POST_US = 0.31
"""What one block costs its NIC over RDMA verbs when a transfer engine's benchmark posts a batch of
many at once: the engine slices each into work requests, posts them and polls the batch once,
where a connector's per-layer request (`KV_LAYER_REQUEST_US`) waits a round trip of its own.
Mooncake's transfer_engine_bench, 4 KiB blocks, 8 threads x batch 128 on one bonded mlx5 port:
13.04 GB/s, 0.314 us a block (kvcache-ai/Mooncake issue 1096, 2025-11-22); MORI-IO's benchmark,
one posting thread at batch 128 on a 400G Thor2: 0.29, 0.33, 0.41 us a block at 1, 4, 8 KiB
(ROCm/mori docs/MORI-IO-BENCHMARK.md @565d89fb4bfd13b9e850bedc445387176e26325a). Not fitted: no
point of physics/data states a batched verbs benchmark."""
KV_TRANSPORTS = ("rdma", "efa")
"""A network KV transfer's transport: RDMA verbs (InfiniBand, RoCE) or AWS EFA."""


def kv_request_us(transport: str = "rdma", batched: bool = False) -> float:
    """What one transfer request costs its NIC on `transport` (`KV_TRANSPORTS`): a connector's
    per-layer request, or (`batched`) one block of a batch posted at once (`KV_BLOCK_POST_US`;
    EFA posts every block as an operation of its own, `KV_EFA_OP_US`, either way)."""
    if transport not in KV_TRANSPORTS:
        raise ValueError(f"kv transport {transport!r}: one of {', '.join(KV_TRANSPORTS)}")
    if transport == "efa":
        return KV_EFA_OP_US
    return KV_BLOCK_POST_US if batched else KV_LAYER_REQUEST_US


def kv_rate_gb_s(path: Path) -> float:
    """The bandwidth a KV transfer gets from `path` (module docstring of the constants above)."""
    line = max(path.bandwidth_gb_s, MIN_GB_S)
    if path.kind.is_network:
        return line * KV_LINE_EFFICIENCY
    return line * BUS_EFFICIENCY["pci" if LINK_HW.get(path.kind, "pci") == "pci" else "nvlink"]


def kv_setup_ms(path: Path) -> float:
    return path.latency_us * 1e-3 + (KV_SETUP_MS if path.kind.is_network else 0.0)


def kv_transfer_ms(model: ModelSpec, tokens: int, path: Path) -> float:
    """The KV of `tokens` over one path (a TP=1 pair, or one rank's shard: `kv_handover_ms`)."""
    if path.tier == "local":
        return 0.0
    return kv_bytes(model, tokens) / (kv_rate_gb_s(path) * 1e9) * 1e3 + kv_setup_ms(path) \
        + kv_requests_ms(model, [path])


def kv_handover_ms(model: ModelSpec, tokens: int, paths: Sequence[Path], rate_factor: float = 1.0) -> float:
    """KV of `tokens` moved as the engines move it: each prefill TP rank sends its shard to the
    decode rank of the same index, all at once (`paths`: one per rank pair). Pairs carried by the
    same link or NIC pair (the same `Path.via`) share its bandwidth; the slowest carrier and the
    worst latency decide. No paths, or only local ones: nothing moves. `rate_factor`: the share of
    that rate the transfer gets (0.5: a NIC on the other socket, `physics.kvpath`)."""
    ms_per_byte, latency_ms = kv_handover_rate(paths)
    if not ms_per_byte:
        return 0.0
    return kv_bytes(model, tokens) * kv_replication(model, len(paths)) * ms_per_byte / rate_factor + latency_ms \
        + kv_requests_ms(model, paths)


def kv_requests_ms(model: ModelSpec, paths: Sequence[Path]) -> float:
    """The transfer requests of a handover (`KV_LAYER_REQUEST_US`): each rank's per-layer K and V
    (MLA: one latent) requests, queued on its NIC behind those of the ranks that share it; only
    over a network (inside a node the bytes are copies, not posted requests)."""
    return kv_layer_requests_ms(model, kv_request_queue(paths))


def kv_request_queue(paths: Sequence[Path]) -> int:
    """How many ranks' requests queue on the busiest network carrier of these paths (0: none
    crosses a network): a function of the paths alone, as a router remembers it per pair."""
    per_carrier: dict[str, int] = {}
    for p in paths:
        if p.kind.is_network and p.tier != "local":
            per_carrier[p.via] = per_carrier.get(p.via, 0) + 1
    return max(per_carrier.values(), default=0)


def kv_layer_requests_ms(model: ModelSpec, queue: int) -> float:
    """`kv_requests_ms` for `queue` ranks on the busiest carrier."""
    per_layer = 1 if model.attention == "mla" else 2
    return queue * per_layer * model.layers * KV_LAYER_REQUEST_US * 1e-3


def kv_replication(model: ModelSpec, tp: int) -> float:
    """How many copies of each KV head a TP group holds: with more ranks than grouped-query KV
    heads every rank keeps one head, so heads are copied tp / kv_heads times and a transfer moves
    that many times the model's KV (SGLang's Qwen3-235B at TP8, 4 KV heads, printed twice the
    model's KV per token). MLA's one latent is not counted again (`kv_shards`)."""
    if model.attention == "mla" or tp <= model.kv_heads or model.kv_heads <= 0:
        return 1.0
    return tp / model.kv_heads


def kv_handover_rate(paths: Sequence[Path]) -> tuple[float, float]:
    """`kv_handover_ms` as (ms per byte of the whole KV, latency ms): a function of the paths
    alone, so a router can remember it per replica pair."""
    moving = [p for p in paths if p.tier != "local"]
    if not moving:
        return 0.0, 0.0
    carried: dict[str, tuple[int, float]] = {}
    for p in moving:
        rate = kv_rate_gb_s(p)
        count, bandwidth = carried.get(p.via, (0, rate))
        carried[p.via] = (count + 1, min(bandwidth, rate))
    share = 1.0 / len(paths)
    slowest_s = max(count * share / (bandwidth * 1e9) for count, bandwidth in carried.values())
    return slowest_s * 1e3, max(kv_setup_ms(p) for p in moving)
