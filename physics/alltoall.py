"""The all-to-all of an expert-parallel gang: one dispatch or combine call over the links it runs
over (`GangLinks`), as the MoE step (`physics.moecost`) prices it, with its fitted constants.

One call (`a2a_us`). Each (token, expert) pair is a message of H elements. Its destination
is a uniformly chosen rank: inside this rank's NVLink domain, over NVLink; outside, over the
rank's own NIC. Both move at once, and the slower one decides, plus a fixed latency:
    low latency       every pair sent on its own (no deduplication)
    high throughput   a token crosses the network once per remote domain it touches (DeepEP's
                      normal kernels send it to the same-rail GPU of that node, which forwards
                      it over NVLink), at most `groups_per_token` domains (group-limited routing)
Fitted to DeepEP's published V1 tables (H800, NVLink 8 lanes = 200 GB/s per direction, one
ConnectX-7 400 Gb/s NIC per GPU; deepseek-ai/DeepEP docs/legacy.md, calibration points
deepep-*): the same two efficiencies and one latency reproduce the low-latency dispatch at EP 8
to 256 (77-194 us) and combine (114-360 us) within 10%.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from physics.a2akernels import expected_ranks, kernel
from physics.collectives import RDMA_LATENCY_US, Hw, collective_us

Carrier = Literal["nvlink", "rdma", "cross-rail", "tcp"]
CARRIERS: tuple[Carrier, ...] = ("nvlink", "rdma", "cross-rail", "tcp")

A2A_NVLINK_EFFICIENCY = 0.77
"""Share of a GPU's NVLink line an all-to-all reaches: DeepEP intranode normal dispatch 153 GB/s
and combine 158 GB/s on H800 (200 GB/s line); its low-latency EP8 dispatch (77 us for 7.57 MB,
7/8 of it to peers) gives 0.78 (calibration points deepep-ht-ep8-*, deepep-ll-ep8-*). DeepEP V2 on
B200: 726 GB/s logical of 900 (0.71 of the line once the local eighth is taken out)."""
A2A_NET_EFFICIENCY = 0.92
"""Share of the NIC's line: least-squares slope of DeepEP's low-latency dispatch latency over the
bytes that leave the node, EP 16..256 (46 GB/s of 50); its combine agrees (EP16 195 us, EP64 314)."""
A2A_LATENCY_US = 35.0
"""Fixed cost of one dispatch or combine call (the intercept of the same fit): kernel launch,
the per-expert counts exchange and completion flags."""
A2A_NET_ROUND_TRIPS = 6.0
"""Network round trips a call that crosses nodes waits on (the data, the per-expert counts, the
completion flags): each pays the network's latency beyond RDMA verbs' (`GangLinks.nic_latency_us`;
EFA's SRD: 15 µs, topology/readers/spec.py). Over EFA the same kernels took 70-105 µs longer per
low-latency call than over ConnectX-7 InfiniBand at EP16-64 (pplx-garden's EFA and CX7 rows), and
UCCL-EP's low-latency kernels 90 µs longer at EP16 on p5en than on CX7 (PPLX-GARDEN and UCCL-EP in
physics/data/published/moe.yaml)."""
A2A_NVLINK_LATENCY_US = 35.0
"""... of a call whose traffic stays inside one NVLink domain (no NIC round trip: no IBGDA
doorbell, no network completion), for the reference kernels (DeepEP's): the network one, and not
fitted. No published point of a reference kernel is a call inside one NVLink domain at a few
tokens, so the points that could move it are other kernels', each with a latency factor of its
own (`a2akernels.A2AKernel.latency_factor`): the product of the two is what those points fix, and
a fit that freed both put the split where the kernel with the most such points pulled it (34 µs
with TensorRT-LLM's one-sided kernel the largest; 53 once MoRI's MI355X SOP, 44 small-token rows,
was added), then priced every kernel it had not seen at that figure: held out, TensorRT-LLM's
small-batch dispatch read 2.5-2.8x. Fixed, each kernel's own factor carries its figure (fitted:
TensorRT-LLM's one-sided 0.67, MoRI's 0.71, Hybrid-EP's 0.69 of it) and a kernel with no point of
its own runs at this one."""
A2A_SM_GB_S = 39.0
"""What one SM's copy loop moves of an all-to-all's bytes (NVLink stores, RDMA posts), beside what it
spends on each token row it copies (`A2A_SM_ROW_US`): a kernel given `sms` SMs takes at least
(rows x `A2A_SM_ROW_US` + bytes / this) / sms. DeepEP's normal kernels on 8 B200 (DeepEP hybrid-ep
docs, DEEPEP-HYBRID in physics/data/published/moe.yaml, 'B200 Platform' table, Torch API), EP8,
4,096 tokens, at 16 SMs: BF16 dispatch 348 GB/s, FP8 dispatch 246 (a row of 7,168 B plus its 56
FP32 scales, 7,392 B), combine 302. A row takes an SM 0.658 µs in BF16 and 0.480 µs in FP8: the
6,944 bytes between them cost 0.178 µs, 39 GB/s, and the 0.29 µs left of a row is not bytes. One
rate per byte cannot give both (21.8 and 15.4 GB/s per SM). The same table at 24 and 32 SMs gives
37 and 34 GB/s and 0.31 µs a row; from 36 SMs on the NVLink line binds. Its combine (BF16, a sum
of the row's copies) takes 0.76 µs a row at 16 SMs, more than a BF16 dispatch's 0.66: the fit to
every point puts the byte rate between the two. On H800 DeepEP's own figure
(153 GB/s at its default SMs) is the line's, not the SMs'. UCCL-EP's normal kernels (DeepEP's copy
loops; its benchmarks run them on 24 SMs, bench/test_intranode.py and test_internode.py) on 8 B200
reach 280 GB/s at FP8 dispatch and 426 at BF16 combine where the NVLink line allows ~690: the same
bound. Priced for the kernels that copy as DeepEP's do (`a2akernels.A2AKernel.sm_copy`): what an SM
moves depends on how the kernel copies (TMA or loads and stores), and the other kernels' SM budgets
are recorded with their points, not priced."""
A2A_SM_ROW_US = 0.29
"""What one token row costs the SM that copies it, apart from its bytes (`A2A_SM_GB_S`): a copy
loop's warp reads the row's routing (its top-k indices and weights), computes where it goes, and
moves the channel's head and tail counters for it, whatever the row's size. Read off DeepEP's B200
sweep (`A2A_SM_GB_S`): the FP8 row is half the BF16 row's bytes but takes 0.73 of its time."""
A2A_SM_WRITE_GB_S = 50.0
"""What one SM writes of an all-to-all's token rows when its kernel stores them with the SM's own
copies rather than DeepEP's copy loops (`a2akernels.A2AKernel.sm_writes`: Hybrid-EP's TMA stores,
each received row written into every local rank's buffer it is routed to): a dispatch given `sms`
SMs takes at least the rows a rank receives x their bytes / (`sms` x this); a combine reads them at
`A2A_SM_READ_GB_S`. Not fitted: DeepEP V2 plans its SM budget with these two per-SM figures
(deepseek-ai/DeepEP deep_ep/buffers/elastic.py @dd758caf, `get_theoretical_num_sms`: "sm_read_gbs:
the per-SM HBM read bandwidth in GB/s. sm_write_gbs: the per-SM HBM write bandwidth in GB/s",
200 and 50, marked "TODO: use different values for other architectures"), which give the 12 and 6
SMs its README runs EP 8x2 and 8x4 on (SM90, CX7). Hybrid-EP's H100 table at 4 SMs (EP16 dispatch
34 GB/s against 62-68 at 8-16 SMs) is where such a bound shows; none of its published rows at 8 SMs
or more is bound by it (an NVLink-only gang of faster parts given 8 SMs would be)."""
A2A_SM_READ_GB_S = 200.0
"""What one SM reads of the rows a combine sums (`A2A_SM_WRITE_GB_S`, the same source)."""
A2A_PROXY_MESSAGE_US = 0.8
"""What a host proxy thread takes to post one network write for a GPU that cannot post it itself
(`GangLinks.gpu_initiated` False). AWS EFA has no GPU-initiated RDMA: NVSHMEM reaches it through its
libfabric transport ("Support for the EFA provider using the libfabric transport", NVSHMEM 2.10.1
release notes, docs.nvidia.com/nvshmem/release-notes-install-guide/prior-releases/release-2101.html,
read 2026-12-04), a proxy-based transport, where a CPU thread issues the network operations the
kernels ask for ("Device APIs on Proxy-Based Transport", NVSHMEM best-practice guide,
docs.nvidia.com/nvshmem/release-notes-install-guide/best-practice-guide/device-apis.html, read
2026-12-04). DeepEP V1's low-latency kernels post one write per (token, expert) pair bound for
another node (`a2akernels.A2AKernel.message_puts`), so over EFA the call is message-bound, not
byte-bound: on 2 and 4 p6-b200 nodes (ADAI-EP-B200 in physics/data/published/moe.yaml, 128
tokens/rank, top-8) FP8 and BF16 dispatch take the same time (EP16 1017.9 vs 1029.7 us for dispatch
+ combine; EP32 1554.2 vs 1558.9), and the time grows with the remote pairs (512 per rank and call
at EP16, 768 at EP32: 1.50x) 1.53x. Posting and sending overlap (the NIC sends what the thread posted
before), so the call takes the longer of the two (added, a BF16 dispatch would take 80-115 us more
than an FP8 one, its extra bytes at the NIC's share; it takes 5-12 us more). The least-squares value
over those 4 points at the priors of the other constants is 0.84 us per write, rounded here (the 4 points
then read 0.93-1.02). The per-expert count and flag writes (one per remote expert each call) are left
out: at these shapes a fifth of the data writes, inside the fitted value.
Two more campaigns by the same team, on other GPUs and with DeepEP's own test (tests/test_low_latency.py,
one kernel's time from its profile), read the same figure: DeepEP 567632d over NVSHMEM 3.7.0 on EFA,
whose build replaces "IBGDA GPU-initiated RDMA with NVSHMEM host-proxy QP APIs" ("Libfabric has 1 proxy
endpoint per PE", awslabs/awsome-distributed-ai 95b939cd micro-benchmarks/expert-parallelism/
deepep-benchmark/setup_deepep_efa.sh; "the single proxy thread", ep-backend-comparison/RESULTS.md). On
8x H100 p5 nodes (RESULTS-p5.md, ADAI-EP-P5) at EP32 and EP64: FP8 dispatch 9.6 and 6.5 GB/s, BF16 combine
20.7 and 15.6 GB/s, i.e. 780 and 1150 µs, 710 and 940 µs per call: the BF16 combine, twice the bytes, no
slower than the FP8 dispatch. On 8x B300 p6 nodes (RESULTS.md, ADAI-EP-B300): 11.2 and 9.2 GB/s, 25.2
and 18.6 GB/s (670 and 810 µs, 580 and 790 µs). Leaving each of the three campaigns out, the others
give 0.72-0.83 µs per write (`python -m pools fidelity --cv source --only ADAI-EP-B200 ADAI-EP-P5
ADAI-EP-B300`), and each campaign's points then read 0.74-1.46 (dispatch above combine by 10-20 % in
both new campaigns, unpriced).
UCCL-EP's and pplx-garden's EFA rows neither contradict nor inform it: UCCL-EP's low-latency kernels also
post one write per remote (token, expert) pair (uccl-project/uccl da914a20 ep/src/internode_ll.cu, the
default build without PER_EXPERT_BATCHING), but from 4 proxy threads per GPU (ep/include/common.hpp
kNumProxyThs 4): at this figure 110-160 µs of posting per call at EP16-32, below the 230-690 µs
UCCL-EP publishes; pplx-garden writes once per peer.
A free constant of the fit (`a2a_proxy_message_us`), moved only by points that state their network;
0 when no training point prices it."""
PROXY_NETWORKS = frozenset({"efa"})
"""Networks with no GPU-initiated RDMA: a host proxy thread posts what the kernels ask
(`GangLinks.gpu_initiated`, `A2A_PROXY_MESSAGE_US`)."""


def gpu_initiated(network: str) -> bool:
    """Whether the GPU can post to the NIC of this network (`topology` fabric technology or
    `cost moe --link`) itself."""
    return network not in PROXY_NETWORKS


CROSS_RAIL_FACTOR = 0.5
"""A gang whose NICs are not on the same rails: its traffic climbs to the spine, whose share of
the line is the fabric's default oversubscription (`topology.Fabric.inter_rack_bandwidth_factor`)."""
CROSS_RAIL_LATENCY_US = 2.0
"""One more switch tier each way (`topology.Fabric.inter_rack_latency_us`)."""
FP8_DISPATCH_BYTES = 1.0 + 4.0 / 128
"""Bytes per element of an FP8 dispatch: the value plus one FP32 scale per 128 (DeepEP's format);
BF16 models dispatch BF16. Combine is BF16 always (DeepEP, DeepSeek's inference overview)."""
DISPATCH_BYTES: dict[str, float] = {
    "bf16": 2.0,
    "fp8": FP8_DISPATCH_BYTES,
    "mxfp8": 1.0 + 1.0 / 32,
    "nvfp4": 0.5 + 1.0 / 16,
    "mxfp4": 0.5 + 1.0 / 32,
}
"""Bytes per element of a dispatch by its format, scales included (`FP8_DISPATCH_BYTES`: DeepEP's
FP8). MXFP8 and MXFP4: one 8-bit E8M0 scale per block of 32 elements (OCP Microscaling Formats (MX)
Specification v1.0, 2023-09); NVFP4: 4-bit values with one FP8 E4M3 scale per block of 16 (NVIDIA,
"Introducing NVFP4 for Efficient and Accurate Low-Precision Inference", NVIDIA Technical Blog,
2025-06-24; its per-tensor FP32 scale is negligible). TensorRT-LLM's post-quant dispatch prints
the same payloads for DeepSeek-V3's 7,168-element token: 7,392 bytes in MXFP8 and 4,032 in NVFP4
(TRTLLM-NVL1S in physics/data/published/moe.yaml). Kernels that quantise before they send (TensorRT-
LLM's NVLinkOneSided) dispatch these; DeepEP dispatches FP8 or BF16 only."""


def default_dispatch(compute: str) -> str:
    """The format an all-to-all sends unless told otherwise: DeepEP's, FP8 for a model whose
    weights compute below BF16, BF16 for a BF16 one (`DISPATCH_BYTES`)."""
    return "bf16" if compute == "bf16" else "fp8"


@dataclass(frozen=True, slots=True, kw_only=True)
class GangLinks:
    """Where an EP gang's all-to-all runs, seen from one rank."""

    carrier: Carrier
    """nvlink: the whole gang in one NVLink domain; rdma: across domains, NICs on the same rails;
    cross-rail: across domains through the spine; tcp: across domains over sockets."""
    domain_ranks: int
    """GPUs of the gang in this rank's NVLink domain (itself included)."""
    nvlink_gb_s: float
    """The GPU's NVLink line, per direction."""
    nic_gb_s: float = 50.0
    """The rank's NIC line, per direction (400 Gb/s)."""
    nic_latency_us: float = 3.0
    outside_share: float | None = None
    """Share of the (token, expert) pairs that leave the rank's domain, when an expert map says
    it (`pools.experts`); None: experts spread uniformly over the ranks."""
    sms: int = 0
    """SMs the all-to-all kernel runs on (its SM budget: DeepEP's `num_sms`); 0: as many as it needs."""
    gpu_initiated: bool = True
    """The GPU can post to the NIC itself (NVSHMEM's IBGDA transport on ConnectX); False: AWS EFA, which
    has no GPU-initiated RDMA, so NVSHMEM drives it through its libfabric transport (EFA provider,
    NVSHMEM 2.10.1 release notes), a proxy-based transport whose host thread posts what the kernels ask
    (`A2A_PROXY_MESSAGE_US`)."""


def signal_chain_us(tokens: int, k: int, ep: int, links: GangLinks) -> float:
    """What a kernel that signals every message (`a2akernels.A2AKernel.signal_per_message`) waits
    beyond its bytes: the (token, expert) pairs bound for one peer (`tokens` x `k` / `ep` with the
    experts spread evenly, at least one) complete in order on that peer's queue pair, each after
    one network round trip (2 x `GangLinks.nic_latency_us`) for its atomic. No fitted figure: the
    round trip is the link's. pplx-kernels' IBGDA rows (PPLX-KERNELS, H100, 128 tokens, top-8)
    fall from EP16 to EP128 (dispatch 622, 428, 317, 308 µs) as the pairs per peer fall
    (64, 32, 16, 8) though the bytes leaving the node grow: about 6 µs a pair."""
    return max(1.0, tokens * k / max(ep, 1)) * 2.0 * links.nic_latency_us


def count_chain_us(tokens: int, k: int, experts: int, remote_share: float, links: GangLinks,
                   block_experts: int) -> float:
    """What a dispatch whose counts go out one warp at a time (`a2akernels.A2AKernel.count_block_experts`)
    waits for them: each warp posts ceil(experts / blocks) counts in turn, `remote_share` of them to
    ranks outside this one's NVLink domain, each after one network round trip (2 x
    `GangLinks.nic_latency_us`), as `signal_chain_us` prices a signal. No fitted figure: the
    round trip is the link's. What the figures say: pplx-kernels' one-token IBGDA dispatch
    (PPLX-KERNELS, H100, 256 experts, 26 blocks: 10 counts a warp) climbs 102.7, 115.7, 121.0,
    125.9 µs from EP16 to EP128 as the remote share of those counts grows (1/2, 3/4, 7/8, 15/16: 5,
    7.5, 8.75, 9.4 remote counts a warp); less 6 µs per remote count, 73, 71, 69, 70 µs: flat, where
    its one-token combine (no counts) stays at 55-63 µs. Why a count waits is not confirmed in
    NVSHMEM's source: a non-fetching atomic over IBGDA is posted without waiting for its completion
    (`nvshmemi_ibgda_amo_nonfetch_impl`), so the cost may be the posting itself (a thread's WQE,
    fences and doorbell), which the round trip stands for here. Left out of the model, it had
    pulled the shared call cost (`A2A_LATENCY_US`) up to 42 µs; with it, 33.5 (prior 35, DeepEP's
    own intercept)."""
    if block_experts <= 0 or experts <= 0 or remote_share <= 0:
        return 0.0
    blocks = max(math.ceil(experts / block_experts), tokens * k, 1)
    return math.ceil(experts / blocks) * remote_share * 2.0 * links.nic_latency_us


def remote_domains(domains: int, k: int, groups_per_token: int) -> float:
    """Expected domains other than its own a token's `k` experts fall in (uniform routing,
    at most `groups_per_token` domains when routing is group-limited and groups map to domains)."""
    if domains <= 1:
        return 0.0
    touched = domains * (1.0 - (1.0 - 1.0 / domains) ** k)
    if groups_per_token > 1:
        touched = min(touched, float(groups_per_token))
    return touched * (domains - 1) / domains


def a2a_us(tokens: int, hidden: int, k: int, element_bytes: float, ep: int, links: GangLinks, mode: str,
           groups_per_token: int = 0, *, experts: int = 0, dispatch: bool = True) -> float:
    """One dispatch (or combine: `dispatch` False) of `tokens` tokens per rank, each to `k` of `ep`
    ranks (module docstring), by the kernel `mode` names (`KERNELS`; "high-throughput" and
    "low-latency" are DeepEP's). `groups_per_token`: DeepSeek's group-limited routing (0: none);
    `experts`: the gang's routed experts (a dispatch's counts; 0: not priced)."""
    return sum(a2a_parts(tokens, hidden, k, element_bytes, ep, links, mode, groups_per_token, experts=experts,
                         dispatch=dispatch))


def a2a_parts(tokens: int, hidden: int, k: int, element_bytes: float, ep: int, links: GangLinks, mode: str,
              groups_per_token: int = 0, *, experts: int = 0, dispatch: bool = True) -> tuple[float, float]:
    """`a2a_us` as (the call's fixed cost, its transfer) in µs: only the transfer streams beside a
    GEMM (`moecost.Overlap`); a collective's whole time is fixed."""
    if ep <= 1 or tokens <= 0:
        return 0.0, 0.0
    impl = kernel(mode)
    token_bytes = hidden * element_bytes
    d = max(1, min(links.domain_ranks, ep))
    pairs = tokens * k * token_bytes
    if links.carrier == "tcp" or impl.collective:
        nodes = max(1, ep // d)
        hw: Hw = "nvlink" if nodes == 1 else "net"
        us = collective_us("alltoall", pairs, ep, links.nvlink_gb_s, hw, nodes=nodes, node_gb_s=links.nic_gb_s * d,
                           net_latency_us=links.nic_latency_us)
        return (us / impl.bandwidth_factor if impl.collective else us), 0.0
    share = None
    if links.outside_share is not None and links.carrier != "nvlink":
        share = min(max(links.outside_share, 0.0), 1.0)
    remote = 0.0 if links.carrier == "nvlink" or d >= ep else (ep - d) / ep
    outside_share = remote if share is None else share
    if impl.dedupe:
        # once per destination rank (forwarded over NVLink inside a remote node), once per remote node
        inside = tokens * token_bytes * expected_ranks(ep, k) * (ep - 1) / ep
        outside = 0.0
        if outside_share > 0 and impl.every_node:
            # every remote node, whatever the routing or the expert map (`A2AKernel.every_node`)
            outside = tokens * token_bytes * float(ep // d - 1)
        elif outside_share > 0:
            outside = tokens * token_bytes * remote_domains(ep // d, k, groups_per_token) * outside_share / max(remote,
                                                                                                               1e-9)
    else:
        inside = pairs * max(0.0, (d - 1) / ep if share is None else 1.0 - share - 1.0 / ep)
        outside = pairs * outside_share
    net = links.nic_gb_s * A2A_NET_EFFICIENCY * (CROSS_RAIL_FACTOR if links.carrier == "cross-rail" else 1.0)
    nvlink = links.nvlink_gb_s * A2A_NVLINK_EFFICIENCY
    slower = max(0.0, links.nic_latency_us - RDMA_LATENCY_US) * A2A_NET_ROUND_TRIPS
    fixed = A2A_LATENCY_US + slower if outside > 0 else A2A_NVLINK_LATENCY_US
    latency = fixed * impl.latency_factor + (CROSS_RAIL_LATENCY_US if links.carrier == "cross-rail" else 0.0)
    if dispatch and outside > 0:
        latency += count_chain_us(tokens, k, experts, outside_share, links, impl.count_block_experts)
    sm_priced = links.sms > 0 and impl.sm_copy
    rows = (inside + outside) / token_bytes if token_bytes > 0 else 0.0
    sm_bound = ((inside + outside) / (A2A_SM_GB_S * 1e9) + rows * A2A_SM_ROW_US * 1e-6) / links.sms \
        if sm_priced else 0.0
    if links.sms > 0 and impl.sm_writes:
        # every row a rank receives, written (dispatch) or read (combine) by its SMs (`A2A_SM_WRITE_GB_S`)
        rate = A2A_SM_WRITE_GB_S if dispatch else A2A_SM_READ_GB_S
        sm_bound = max(sm_bound, tokens * expected_ranks(ep, k) * token_bytes / (links.sms * rate * 1e9))
    # the kernel's factor scales its share of the links; its SMs copy as DeepEP's do (`sm_copy`)
    # a kernel that posts one write per remote (token, expert) pair, on a NIC the GPU cannot drive:
    # one host proxy thread posts them while the NIC sends what it posted before, so the call takes
    # the longer of the two (`A2A_PROXY_MESSAGE_US`)
    proxied = impl.message_puts and not links.gpu_initiated and outside > 0
    posting = tokens * k * outside_share * A2A_PROXY_MESSAGE_US * 1e-6 if proxied else 0.0
    seconds = max(max(inside / (nvlink * 1e9), outside / (net * 1e9) if outside else 0.0) / impl.bandwidth_factor,
                  sm_bound, posting)
    chain = signal_chain_us(tokens, k, ep, links) if impl.signal_per_message and outside > 0 else 0.0
    return latency, seconds * 1e6 + chain
