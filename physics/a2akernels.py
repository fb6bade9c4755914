"""All-to-all implementations as the MoE step prices them (`physics.alltoall.a2a_us`): each
kernel's family (how it moves a token) and its factors against the family's reference figures.
`cost moe --a2a NAME` names one."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class A2AKernel:
    """One all-to-all implementation: how it moves a token (`dedupe`: once per destination rank
    and once per remote node, forwarded there over NVLink, as DeepEP's normal kernels do; or once
    per (token, expert) pair, as low-latency kernels do) and how much of the links' shares
    (`A2A_NVLINK_EFFICIENCY`, `A2A_NET_EFFICIENCY`) and of the fixed cost (`A2A_LATENCY_US`) it
    reaches. A kernel with no published point of its own runs at its family's: factors 1."""

    dedupe: bool
    bandwidth_factor: float = 1.0
    latency_factor: float = 1.0
    source: str = ""
    sm_copy: bool = False
    """Moves its bytes with DeepEP's own copy loops (warps loading and storing each token on the
    SMs it is given), so an SM budget bounds it: each SM moves `physics.alltoall.A2A_SM_GB_S` of
    bytes and pays `physics.alltoall.A2A_SM_ROW_US` for each token row it copies. DeepEP's
    kernels and the forks that keep their kernels (UCCL-EP: "the same interface and functionality
    as DeepEP", its bench/test_intranode.py "the same test_intranode.py test in DeepEP's repo",
    uccl-project/uccl 072a55c). Kernels that copy otherwise (Hybrid-EP's TMA, pplx's, MoRI's)
    are not bounded by it: what their SMs move is not the same figure (Hybrid-EP's: `sm_writes`)."""
    sm_writes: bool = False
    """Stores the rows it moves with its SMs' bulk copies (TMA), not DeepEP's copy loops, so an SM
    budget bounds it by the bytes an SM writes and reads (`physics.alltoall.A2A_SM_WRITE_GB_S`):
    Hybrid-EP, whose every SM runs one persistent block that copies each received token to the
    local ranks it is routed to (DeepEP hybrid-ep branch, docs/Hybrid-EP_Implementation.md)."""
    collective: bool = False
    """Not an EP kernel but NCCL's all_to_all (torch.distributed): priced as NCCL prices an
    all-to-all (`physics.collectives`), every (token, expert) pair a message."""
    message_puts: bool = False
    """Posts one network write per (token, expert) pair bound for another node (and its combine one
    back): DeepEP V1's low-latency kernels, whose warps each put one token to one expert's receive
    buffer (deepseek-ai/DeepEP csrc/kernels/internode_ll.cu @2df3680e, "Issue IBGDA sends": one
    put per token and top-k slot whose rank NVLink does not reach, then one count per expert).
    Where the GPU can drive the NIC itself (IBGDA on ConnectX) those puts cost nothing beyond their
    bytes; where it cannot
    (`physics.alltoall.GangLinks.gpu_initiated` False: AWS EFA, which NVSHMEM reaches only through its
    libfabric transport, a proxy-based one) one host proxy thread posts every one of them
    (`physics.alltoall.A2A_PROXY_MESSAGE_US`). Kernels that batch their writes are not bound by it:
    pplx-garden writes once per peer, DeepEP's normal kernels send in chunks. UCCL-EP's low-latency
    kernels are not priced so, though they also post one write per (token, expert) pair bound for
    another node ("Legacy path: directly issue one RDMA send per token", uccl-project/uccl
    ep/src/internode_ll.cu @48f4f395 and @da914a20; one write per remote expert only when built with
    PER_EXPERT_BATCHING, as ADAI-EP-B200's UCCL arm is): they go through UCCL's own verbs proxy, not
    NVSHMEM's, with 4 threads (ep/include/common.hpp kNumProxyThs) of 8 command FIFOs each, a write's
    FIFO chosen by its destination expert's local index, at most 32 writes in flight per FIFO
    (kMaxInflightLowLatency), and on EFA each write carries an immediate that the receiving proxy
    polls and counts (USE_RECEIVER_BARRIER; ep/src/rdma.cpp). No per-write cost of that proxy is
    published, and its EFA rows (README p5en and p6-b200, bench/test_low_latency.py's 288 experts)
    dispatch in 0.44-0.66 µs per remote write and GPU at EP16-32, not the 0.2 µs that 0.8 µs over 4 threads
    would give."""
    every_node: bool = False
    """A deduplicating kernel (`dedupe`) that sends every token to every remote node, whether or not
    one of its experts is there: MoRI's inter-node V1 low-latency dispatch puts each whole 32-token
    chunk to every other node (DispatchInterNodeLLSend: the put's token count is the chunk's, the
    routing only marks the map) and its combine returns what it received (CombineInterNodeLL;
    ROCm/mori src/ops/dispatch_combine/internode_v1.cpp @013c13bc). Its normal kernel
    (DispatchInterNodeSend with DEDUP) sends only the tokens routed to that node."""
    signal_per_message: bool = False
    """Follows each (token, expert) write to another node with its own remote atomic on the same
    queue pair: pplx-kernels' dispatch and combine post one `nvshmemx_putmem_signal_nbi_warp` per
    pair (ppl-ai/pplx-kernels csrc/all_to_all/internode_dispatch.cu and internode_combine.cu
    @12cecfda, the same in internode_scatter.cu / internode_gather.cu @7af30594, the commit of its
    README table), which NVSHMEM's IBGDA transport posts as an RDMA write then an atomic WQE on the
    one queue pair it keeps for that peer (NVSHMEM ibgda_device.cuh,
    `nvshmemi_ibgda_put_signal_thread_impl`); pplx leaves NVSHMEM's per-peer queue pairs at their
    default (its README sets only NVSHMEM_IB_ENABLE_IBGDA=1), where DeepEP's low-latency kernels
    give every local expert a queue pair of its own (NVSHMEM_IBGDA_NUM_RC_PER_PE = num_qps_per_rank)
    and signal once per expert. The pairs bound for one peer then complete one after another, each
    waiting the network's round trip for its atomic (`physics.alltoall.signal_chain_us`)."""
    count_block_experts: int = 0
    """A dispatch that tells every expert of the gang how many tokens it sends it, one remote
    signal per expert, from one warp per thread block, each warp its experts one after another
    (`physics.alltoall.count_chain_us`); the blocks are one per this many experts or one per
    (token, expert) pair, whichever are more. pplx-kernels' dispatch launches max(ceil(experts / 10),
    tokens x top-k) blocks of 10 warps (up to the GPU's SMs), and the last warp of each block posts
    `nvshmemx_signal_op` for every `gridDim`-th expert in turn (ppl-ai/pplx-kernels
    csrc/all_to_all/internode_dispatch.cu @12cecfda, `dispatchKernel` and its launch). 0: the counts
    go out at once (DeepEP's low-latency dispatch: each expert's count from the warp group that
    `responsible_expert_idx` gives it, csrc/kernels/internode_ll.cu)."""


KERNELS: dict[str, A2AKernel] = {
    "deepep-normal": A2AKernel(True, sm_copy=True, source="DeepEP V1 normal kernels (calibration.yaml deepep-ht-*)"),
    "deepep-ll": A2AKernel(False, sm_copy=True, message_puts=True,
                           source="DeepEP V1 low-latency kernels (calibration.yaml deepep-ll-*)"),
    "pplx": A2AKernel(False, 0.81, 1.7, signal_per_message=True, count_block_experts=10,
                       source="pplx-kernels (ppl-ai/pplx-kernels @12cecfda): one put + atomic signal per "
                              "(token, expert) pair (`signal_per_message`); its two factors fitted to its README "
                              "rows (PPLX-KERNELS, 20 points) with that priced, 1 when they are held out"),
    "nccl": A2AKernel(False, collective=True,
                       source="torch.distributed all_to_all over NCCL, priced as NCCL prices an all-to-all; "
                              "PPLX-KERNELS's baseline rows (5 points) time one all_to_all_single of a dense "
                              "buffer (their `buffer: dense`)"),
    "uccl-ep-normal": A2AKernel(True, 0.84, 3.0, sm_copy=True,
                       source="uccl-project/uccl ep/README.md (UCCL-EP): H200/B200/MI300X normal rows"),
    "uccl-ep-ll": A2AKernel(False, 0.45, 0.65, sm_copy=True, source="UCCL-EP low-latency rows"),
    "hybrid-ep": A2AKernel(True, 0.89, 0.1, sm_writes=True,
                       source="DeepEP hybrid-ep branch README (DEEPEP-HYBRID): H100/B200/GB200 rows"),
    "deepep-v2": A2AKernel(True, 1.0, 1.0,
                       source="DeepEP V2 README: its rows name no GPU, so none is priced: DeepEP V1's normal kernels"),
    "mori-ep": A2AKernel(True, 0.82, 0.26, source="ROCm/mori MORI-EP-BENCHMARK.md (MORI): MI300X normal rows"),
    "mori-ep-ll": A2AKernel(True, 0.46, 0.92, every_node=True,
                       source="MORI low-latency rows. Dedupes as DeepEP's normal kernels do: its inter-node V1 "
                              "low-latency dispatch puts each 32-token chunk once per remote node, to the rank of "
                              "the same local index there (DispatchInterNodeLLSend, proxyPe), which copies it on "
                              "over XGMI; its combine sums a node's experts there and puts one token back per node "
                              "(CombineInterNodeLL) (ROCm/mori src/ops/dispatch_combine/internode_v1.cpp @013c13bc; "
                              "KernelType::InterNodeV1LL, the README's 'EP16-V1-LL'). Priced per pair, its factors "
                              "had to exceed the NIC's line (1.87); priced so, 0.46"),
    "pplx-garden": A2AKernel(False, 0.9, 0.92, source="perplexityai pplx-garden docs/fabric-lib.md (PPLX-GARDEN)"),
    "trtllm-nvlink-one-sided": A2AKernel(False, 1.04, 0.67,
                       source="TensorRT-LLM tech blog 18 NVLinkOneSided, GB200 NVL72 (TRTLLM-NVL1S): 40 points"),
}
"""`--a2a` kernels. Each kernel's two factors are fitted to its own published points alone, the
family's constants fixed (physics/data/published/moe.yaml; `python -m pools fidelity --fit`
prints the fit); "high-throughput" and "low-latency" name DeepEP's two, which set the families."""
REFERENCE_KERNELS = frozenset({"deepep-normal", "deepep-ll"})
"""The families' references (DeepEP's kernels): their factors are 1 by definition. An SM budget is
priced for the kernels that copy as they do (`A2AKernel.sm_copy`; `physics.alltoall.A2A_SM_GB_S`,
`physics.alltoall.A2A_SM_ROW_US`)."""
MODE_KERNELS = {"high-throughput": "deepep-normal", "low-latency": "deepep-ll", "torch-alltoall": "nccl"}
"""Other names of `KERNELS` entries: DeepEP's two modes; torch.distributed's all_to_all (NCCL's)."""


def kernel(name: str) -> A2AKernel:
    found = KERNELS.get(MODE_KERNELS.get(name, name))
    if found is None:
        raise ValueError(f"unknown all-to-all kernel {name!r} (known: {', '.join([*MODE_KERNELS, *KERNELS])})")
    return found


def expected_ranks(ep: int, k: int) -> float:
    """Distinct ranks a token's `k` experts fall on, experts spread evenly over `ep` ranks."""
    if ep <= 1:
        return 1.0
    return ep * (1.0 - math.pow(1.0 - 1.0 / ep, k))
