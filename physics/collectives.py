"""Collectives priced the way NCCL prices them when it picks an algorithm (NVIDIA/nccl
src/graph/tuning.cc, `ncclTopoTuneModel` / `ncclTopoGetAlgoTime`): for each algorithm (ring,
tree, NVLS) and protocol (LL, LL128, Simple), time = latency + bytes / algorithm bandwidth, and
the cheapest wins, as NCCL's tuner chooses.

    bus bandwidth     what the links carry: the per-GPU line rate x `BUS_EFFICIENCY` (nccl-tests'
                      large-message busbw is 0.78-0.82 of the line on NVSwitch), across nodes the
                      node's NICs together (one rail per GPU; NCCL's rings cross every node on
                      each rail), never more than inside the node
    protocol          LL carries 1/4 of it (half the payload is flags, and it is a poll loop),
                      LL128 0.92 (120 of 128 bytes), Simple all of it (tuning.cc)
    algorithm bw      ring: busbw x k / steps (all-reduce 2(k-1) steps, gather/scatter k-1);
                      tree (all-reduce across nodes): the nodes' NICs (two nodes), LL for
                      small messages at 1/3.8 of it; NVLS (all-reduce in one
                      NVSwitch domain with NVLink SHARP): the switch reduces, so each byte
                      crosses a GPU's links once: `NVLS_EFFICIENCY` of the line
    latency           NCCL's base latency per algorithm/protocol plus its per-step hardware
                      latency (NVLink, PCI, network) for every step of the algorithm, plus the
                      launch a measured call pays (`LAUNCH_US`)

Two libraries' own choices on top: RCCL's MSCCL all-pairs all-reduce on one node of 8 GPUs
(`MSCCL_LIBRARIES`: two steps instead of a ring's 14, LL up to 512 KiB), and an all-reduce across
AWS EFA nodes, Simple only and priced as AWS's NCCL tuner plugin prices it (`EFA_NETWORKS`).

An all-to-all (expert parallelism's dispatch) is k-1 concurrent sends of m/k bytes: one step,
(k-1)/k of the message over each GPU's links.
"""

from __future__ import annotations

import functools
import math
from typing import Literal

Hw = Literal["nvlink", "pci", "net"]
OPS = ("allreduce", "allgather", "reducescatter", "alltoall")
ALGORITHMS = ("ring", "tree", "nvls")
"""What `NCCL_ALGO` can pin (NCCL's names, lower case); None: NCCL's tuner picks the cheapest."""

BASE_LAT_US: dict[str, tuple[float, float, float]] = {"tree": (6.8, 14.0, 0.0), "ring": (6.6, 14.0, 8.4)}
"""NCCL's baseLat (tuning.cc), µs, per protocol (LL, LL128, Simple)."""
HW_LAT_US: dict[Hw, dict[str, tuple[float, float, float]]] = {
    "nvlink": {"tree": (0.52, 1.2, 28.0), "ring": (0.47, 1.9, 3.4)},
    "pci": {"tree": (1.0, 1.9, 28.0), "ring": (1.0, 2.5, 5.7)},
    "net": {"tree": (5.0, 8.5, 50.0), "ring": (2.7, 4.0, 9.6)},
}
"""NCCL's hwLat (tuning.cc), µs per step, per hardware, algorithm and protocol."""
PROTOCOL_SHARE = (0.25, 0.92, 1.0)
"""Share of the bus bandwidth each protocol carries (tuning.cc: ring LL x 1/4 for all-reduce,
LL128 x 0.92 = 120/128, Simple x 1)."""
BUS_EFFICIENCY: dict[Hw, float] = {"nvlink": 0.80, "pci": 0.80, "net": 0.90}
"""Large-message bus bandwidth over the line rate. NVLink/NVSwitch: nccl-tests all_reduce busbw
367.2 of 450 GB/s on 8x H200 with NVLS off and 234.9 of 300 on 8x A100 (stas00/ml-engineering
network/README.md; calibration points mleng-h200-8gpu-allreduce-ring-16GiB-busbw and
mleng-a100-8gpu-allreduce-16GiB-busbw). PCIe taken as NVLink (no published point here).
Network: 364.9 GB/s busbw over p5en's 3200 Gb/s of EFA per node (same source, 4 x 8 H200)."""
NVLS_EFFICIENCY = 0.61
"""NVLS all-reduce's algorithm bandwidth over the per-GPU NVLink line: busbw 480 GB/s on 8x
H200 (algbw 480 / (2 x 7/8) = 274 of 450; ml-engineering, NCCL_NVLS_ENABLE=1 row)."""
NVLS_HOPPER = 0.85
"""NCCL's `nvlsEfficiency` for Hopper (NVIDIA/nccl src/graph/tuning.cc, later src/tuning/nvls.cc:
Hopper 0.85, Blackwell 0.74): what its tuner takes an NVLS all-reduce to reach of the NVLink
bandwidth on each generation. `NVLS_EFFICIENCY` is measured on Hopper; a part of another
generation (`catalog.GpuSpec.nvls_efficiency`) scales it by its own figure over this one:
Blackwell's NVLink doubled and its switch's reductions did not keep pace (8x B200, NCCL 2.27.7:
NVLS busbw 838 GB/s = 0.53 of its 900 GB/s as algorithm bandwidth, 0.61 x 0.74 / 0.85 = 0.53;
ml-engineering, calibration point mleng-b200-8gpu-allreduce-nvls-8GiB-busbw)."""
NVLS_LATENCY_US = 25.0
"""NVLS all-reduce's latency: NCCL's hwLat for NVLS over NVLink (Simple) is 25 µs with no base
latency (tuning.cc, `hwLat[NVLINK][NVLS] = {0, 0, 25}`): the switch's multicast set-up and the
memory-semantic synchronisation make NVLS slower than a ring at small messages, where NCCL's tuner
keeps ring LL/LL128."""
NVLS_MIN_GPUS = 5
"""NCCL ran ring, not NVLS, for 4 GPUs of an H200 node (the same busbw with NVLS on and off, ml-
engineering's GPU-count sweep) and NVLS for 8."""
TREE_PROTOCOL_SHARE = (0.92 / 3.8, 0.92 * 120 / 128, 0.92)
"""Share of the bus bandwidth a tree carries per protocol (tuning.cc: a tree all-reduce x 0.92 under
every protocol, then LL x 1/3.8 and, across nodes, LL128 x 120/128 on top). Tree LL
is what NCCL picks for small all-reduces across nodes: its latency, 2 x ((GPUs per node - 1)
intra-node steps + floor(log2(nodes)) network steps, NCCL's log2i), beats a ring's 2 x (ranks - 1) steps (nccl-tests
8 KiB over 2 and 4 nodes of 8 H100: 32.1 and 46.8 µs; NCCLT-309 in physics/data/published)."""
TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
)
"""NCCL's measured tree efficiency per protocol and size (src/tuning cost model,
`treeCorrectionFactor`: powers of two from 64 B, index log2(bytes / 64)): a tree all-reduce
reaches 0.4-0.6 of its modelled bandwidth at 128 KiB-4 MiB and all of it at the ends."""
TREE_DEEP_SHARE = 0.44
"""A tree all-reduce's algorithm bandwidth over the node's NIC bandwidth. On two nodes every
node sends each byte once (it is the root of one of NCCL's two trees and a leaf of the other):
algbw = the NICs' rate (8x H100 over 8x 200 Gb/s, 8 GiB: algbw 180.7 GB/s, busbw 338.8; calibration
point a3mega-h100-16rank-allreduce-8GiB-busbw). Deeper trees relay through interior nodes:
nvlstree on 4 x 8 H200 over EFA reached busbw 310.07 = algbw 160 of the NICs' 360 (ml-engineering),
where NCCL kept ring (364.9)."""
TREE_LIBRARIES = frozenset({"nccl"})
"""Libraries whose tree all-reduce across nodes is priced: NCCL's two complementary trees let a
two-node all-reduce send each byte over the NICs once (`TREE_DEEP_SHARE`). RCCL is priced with
rings across nodes: its published two-node all-reduces (rccl-tests, 2 x 8 MI300X / MI325X /
MI355X over 8 x 400 Gb/s, 8-16 GiB: busbw 350-369 GB/s; Hisohara, physics/data/published/
collectives-kv.yaml) sit at the ring's bound (the NICs' 400 GB/s x `BUS_EFFICIENCY`), not at the
tree's, which would be twice that."""
RING_PLATEAU = 1.9
"""tuning.cc: a multi-node ring Simple all-reduce's latency x 1.9 (its 'plateau effect')."""
RDMA_LATENCY_US = 3.0
"""The network latency NCCL's NET step latencies stand for (InfiniBand/RoCE verbs; topology.kinds
RDMA)."""
LAUNCH_US = 10.0
"""What a measured call adds to NCCL's model: the kernel launch and nccl-tests' per-iteration
synchronisation (~6-10 µs for a 1-byte all-reduce on one node; NCCL's model starts at its base
latency)."""


EFA_STEP_LATENCY_US = 18.0
"""One network step over AWS EFA (SRD through libfabric), as AWS's NCCL tuner plugin prices it for
P5en and P6-B200 (aws/aws-ofi-nccl src/tuner/nccl_ofi_model.cpp
@2daf7d303aa139a03140aa530957d10521e4478d: `net_lat = 18.0`; P5/P5e 20.0), plus
`EFA_SIMPLE_OVERHEAD_US` under Simple."""
EFA_SIMPLE_OVERHEAD_US = 3.0
"""The plugin's `TUNER_NET_COMP_OVERHEAD` (default 3 µs, include/nccl_ofi_param.h, same commit): a
Simple step's completion through libfabric and NCCL's proxy thread."""
EFA_NETWORKS = frozenset({"efa"})
"""Networks whose all-reduce across nodes is priced as AWS's plugin prices it (`_efa_allreduce_us`).
Over EFA NCCL runs Simple alone: the plugin sets `NCCL_PROTO=simple` when the endpoint does not
guarantee in-order delivery of aligned 128-byte writes, "as the LL/LL128 protocols can lead to data
corruption without data delivery ordering" (src/platform-aws.cpp, same commit; P5en over the RDMA
protocol is exempted there, and its one published point here, 4 GiB, is bandwidth-bound). AWS's
own tuner (`NCCL_TUNER_PLUGIN=ofi`, what ml-engineering's EFA runs used) prices a ring all-reduce as
2 x nodes network steps and the other 2 (k-1) - 2 x nodes steps at NVLink's Simple latency, with no
base latency and no plateau factor: 352 µs for 4 x 8 GPUs, where the published per-call floor of
ml-engineering's 4 x 8 B200 table is ~360-390 µs from 256 KiB to 2 MiB less its per-call overhead."""
MSCCL_LIBRARIES = frozenset({"rccl"})
"""Libraries that ship MSCCL algorithms for one node of 8 GPUs: RCCL's `allreduce_pairs` (ROCm/rccl
tools/msccl-algorithms/allreduce-allpairs-8n-ll-*.xml @0cbce2a7571c907554199fad7e905f16ec0a565c,
installed with the library and enabled on its MI300X-class topologies, src/graph/rome_models.cc
`mscclEnabled=1`)."""
MSCCL_ALLPAIRS_GPUS = 8
MSCCL_ALLPAIRS_LL_MAX_BYTES = 524287
"""RCCL's all-pairs all-reduce over the LL protocol covers 0-65536 B (32 thread blocks) and
65537-524287 B (64): each GPU sends its 1/8 share to the 7 others at once, reduces, and sends the sum
back the same way, so a call waits on two steps where a ring waits on 2 x (8 - 1), and moves the same
2 x 7/8 of the message per GPU. The source's own numbers show the switch: rccl-tests on 8x MI300X
(HISOHARA) takes 23.2 us at 512 B, where the algorithm's 256 chunks per loop do not divide the
128 floats, and 13.7 us from 1 KiB to 64 KiB, where they do."""


def collective_us(op: str, message_bytes: float, ranks: int, line_gb_s: float, hw: Hw, *, nodes: int = 1,
                  nvls: bool = False, node_gb_s: float | None = None, net_latency_us: float = RDMA_LATENCY_US,
                  library: str = "nccl", algorithm: str | None = None, nvls_efficiency: float = NVLS_HOPPER,
                  efa: bool = False) -> float:
    """One collective of `message_bytes` per GPU (nccl-tests' size) over `ranks` GPUs on `nodes`
    nodes. `line_gb_s`: each GPU's line rate inside its node (per direction); across nodes
    `node_gb_s` is the node's NIC bandwidth in total (one rail per GPU: 8 x 400 Gb/s = 400 GB/s).
    `nvls`: the node's NVSwitch does NVLink SHARP (H100 and later). `net_latency_us`: the
    network's latency; NCCL's network step latencies are for RDMA verbs, a slower transport
    (sockets) adds the difference to every step that crosses nodes. `library`: nccl or rccl
    (`TREE_LIBRARIES`). `algorithm`: the one NCCL is pinned to (`NCCL_ALGO=Ring`, `Tree`, `NVLS`,
    as a benchmark that sweeps the algorithms runs it); NCCL still picks the protocol, and where the
    pinned algorithm cannot run the collective (NVLS across nodes or without NVLink SHARP, a tree
    inside one node) NCCL falls back to its tuner's choice, and so does this. `nvls_efficiency`:
    NCCL's `nvlsEfficiency` for the part's generation (`NVLS_HOPPER`). `efa`: the nodes talk over AWS
    EFA through AWS's plugin (`EFA_NETWORKS`)."""
    if op not in OPS:
        raise ValueError(f"unknown collective {op!r} (known: {', '.join(OPS)})")
    if algorithm is not None and algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r} (known: {', '.join(ALGORITHMS)})")
    if ranks <= 1 or message_bytes <= 0:
        return 0.0
    extra = max(0.0, float(net_latency_us) - RDMA_LATENCY_US)
    return _collective_us(op, float(message_bytes), ranks, float(line_gb_s), hw, max(1, min(nodes, ranks)),
                          nvls_efficiency / NVLS_HOPPER if nvls else 0.0,
                          None if node_gb_s is None else float(node_gb_s), extra, library in TREE_LIBRARIES, algorithm,
                          library in MSCCL_LIBRARIES, efa)


@functools.lru_cache(maxsize=65536)
def _collective_us(op: str, size: float, ranks: int, line: float, hw: Hw, nodes: int, nvls_scale: float,
                   node_gb_s: float | None, extra_us: float, tree: bool = True, algorithm: str | None = None,
                   msccl: bool = False, efa: bool = False) -> float:
    if efa and op == "allreduce" and nodes > 1:
        times = {"ring": _efa_allreduce_us(size, ranks, line, nodes, node_gb_s)}
    else:
        times = _algorithm_us(op, size, ranks, line, hw, nodes, nvls_scale, node_gb_s, extra_us, tree)
    if msccl and op == "allreduce" and nodes == 1 and ranks == MSCCL_ALLPAIRS_GPUS and hw != "pci" \
            and size <= MSCCL_ALLPAIRS_LL_MAX_BYTES and algorithm is None:
        times["msccl"] = _allpairs_ll_us(size, ranks, max(line, 0.01) * BUS_EFFICIENCY["nvlink"])
    pinned = times.get(algorithm or "", math.inf)
    return (pinned if pinned < math.inf else min(times.values())) + LAUNCH_US


def _algorithm_us(op: str, size: float, ranks: int, line: float, hw: Hw, nodes: int, nvls_scale: float,
                  node_gb_s: float | None, extra_us: float, tree: bool) -> dict[str, float]:
    """Each algorithm's time under its cheapest protocol (NCCL's tuner within one algorithm), without
    the launch; an algorithm that cannot run the collective is absent. `nvls_scale`: the part's NVLS
    efficiency over Hopper's (0: no NVLS)."""
    per_node = max(1, ranks // nodes)
    intra: Hw = "pci" if hw == "pci" else "nvlink"
    bus, net = _bus_and_net(line, intra, per_node, nodes, node_gb_s)
    if op == "alltoall":
        return {"alltoall": _alltoall_us(size, ranks, per_node, bus, net, intra, nodes) + extra_us}
    if nodes > 1:
        bus = min(bus, net)  # one rail per GPU: the ring crosses every node on each rail
    steps = 2 * (ranks - 1) if op == "allreduce" else ranks - 1
    inter_steps = (2 if op == "allreduce" else 1) * (nodes - 1)
    ring = tree_us = math.inf
    for p in range(3):
        if p == 1 and nodes > 1:
            continue  # NCCL enables LL128 only when no step leaves the node (tuning.cc, typeInter <= PXB)
        intra_lat = HW_LAT_US[intra]["ring"][p] * (1.8 if nodes > 1 and p == 0 else 1.0)  # tuning.cc: LL x 1.8
        inter_lat = HW_LAT_US["net"]["ring"][p] + extra_us
        lat = BASE_LAT_US["ring"][p] + (steps - inter_steps) * intra_lat + inter_steps * inter_lat
        if op == "allreduce" and nodes > 1 and p == 2:
            lat *= RING_PLATEAU
        ring = min(ring, lat + size / (1e3 * bus * PROTOCOL_SHARE[p] * ranks / steps))
        if op == "allreduce" and nodes > 1 and tree:  # tree: Simple for bandwidth, LL for small messages
            log_size = int(math.log2(max(size, 64.0) / 64.0))
            correction = TREE_CORRECTION[p][log_size] if log_size < len(TREE_CORRECTION[p]) else 1.0
            tree_bw = net * TREE_PROTOCOL_SHARE[p] * correction * (1.0 if nodes == 2 else TREE_DEEP_SHARE)
            tree_lat = BASE_LAT_US["tree"][p] + 2 * ((per_node - 1) * HW_LAT_US[intra]["tree"][p]
                                                     + int(math.log2(nodes)) * (HW_LAT_US["net"]["tree"][p] + extra_us))
            tree_us = min(tree_us, tree_lat + size / (1e3 * tree_bw))
    times = {"ring": ring}
    if tree_us < math.inf:
        times["tree"] = tree_us
    if op == "allreduce" and nvls_scale > 0 and nodes == 1 and intra == "nvlink" and ranks >= NVLS_MIN_GPUS:
        times["nvls"] = NVLS_LATENCY_US + size / (1e3 * line * NVLS_EFFICIENCY * nvls_scale)
    return times


def _bus_and_net(line: float, intra: Hw, per_node: int, nodes: int, node_gb_s: float | None) -> tuple[float, float]:
    """A GPU's bus rate inside its node (inf alone there) and its node's network rate (0 on one
    node: the node's NICs, `node_gb_s`, or else the GPUs' own lines), at their bus efficiencies."""
    bus = max(line, 0.01) * BUS_EFFICIENCY[intra] if per_node > 1 else math.inf
    net = 0.0
    if nodes > 1:
        net = (node_gb_s if node_gb_s is not None else max(line, 0.01) * per_node) * BUS_EFFICIENCY["net"]
    return bus, net


def _efa_allreduce_us(size: float, ranks: int, line: float, nodes: int, node_gb_s: float | None) -> float:
    """A ring all-reduce across EFA nodes under Simple, its latency as AWS's tuner prices it
    (`EFA_NETWORKS`), its bandwidth the ring's over the node's NICs (as `_algorithm_us`)."""
    inside, net = _bus_and_net(line, "nvlink", max(1, ranks // nodes), nodes, node_gb_s)
    bus = min(inside, net)
    steps, inter = 2 * (ranks - 1), 2 * nodes
    lat = (inter * (EFA_STEP_LATENCY_US + EFA_SIMPLE_OVERHEAD_US)
           + max(0, steps - inter) * HW_LAT_US["nvlink"]["ring"][2])
    return lat + size / (1e3 * bus * ranks / steps)


def _allpairs_ll_us(size: float, ranks: int, bus: float) -> float:
    """MSCCL's all-pairs all-reduce under LL (`MSCCL_ALLPAIRS_LL_MAX_BYTES`): NCCL's ring LL base
    latency and two NVLink-class steps; 2 (k-1)/k of the message per GPU at LL's share of the bus."""
    lat = BASE_LAT_US["ring"][0] + 2 * HW_LAT_US["nvlink"]["ring"][0]
    return lat + size * 2 * (ranks - 1) / ranks / (1e3 * bus * PROTOCOL_SHARE[0])


def _alltoall_us(size: float, ranks: int, per_node: int, bus: float, net: float, intra: Hw, nodes: int) -> float:
    """Every GPU sends m/k to each other GPU at once: (ppn-1)/k of m over its links in the node,
    (k-ppn)/k over its share of the node's NICs, both at the same time; one step's latency."""
    inside = size * (per_node - 1) / ranks / (1e3 * bus) if per_node > 1 else 0.0
    across = size * (ranks - per_node) / ranks / (1e3 * net / per_node) if nodes > 1 else 0.0
    lat = BASE_LAT_US["ring"][2] + HW_LAT_US["net" if nodes > 1 else intra]["ring"][2]
    return lat + max(inside, across)


def bus_factor(op: str, ranks: int) -> float:
    """nccl-tests' bus bandwidth = algorithm bandwidth x this (its doc/PERFORMANCE.md)."""
    return 2 * (ranks - 1) / ranks if op == "allreduce" else (ranks - 1) / ranks
