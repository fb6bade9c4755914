"""Path bandwidth and latency between any two GPUs of the cluster, and the tier function.

The tier is the label a request's path carries in metrics (DESIGN.md): `nvlink` (inside one
island), `pcie` (same node over PCIe or a host bridge), `numa` (crosses sockets), `rdma` and
`tcp` (cross-node), `rack` (crosses racks). A single GPU has no interconnect path: `local`.
`tier()` is the one function that computes it; everything else calls it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import combinations
from typing import Literal

from topology.islands import fabric_clique_bandwidth_gb_s
from topology.kinds import DEFAULTS, LinkKind, default_bandwidth_gb_s, default_latency_us
from topology.model import GpuRef, Nic, Node, Topology

Tier = Literal["local", "nvlink", "pcie", "numa", "rdma", "tcp", "rack"]
TIERS: tuple[Tier, ...] = ("local", "nvlink", "pcie", "numa", "rdma", "tcp", "rack")
"""Best to worst."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Path:
    kind: LinkKind
    tier: Tier
    bandwidth_gb_s: float
    latency_us: float
    healthy: bool = True
    via: str = ""
    """What carries it: 'GPU0-GPU1 NV18', 'NIC mlx5_0 -> mlx5_3', 'fabric clique ...'."""


LOCAL = Path(kind=LinkKind.NVSWITCH, tier="local", bandwidth_gb_s=float("inf"), latency_us=0.0)


def tier_of_kind(kind: LinkKind, crosses_rack: bool = False) -> Tier:
    if kind.is_gpu_fabric:
        return "nvlink"
    if kind is LinkKind.SYS:
        return "numa"
    if kind.is_network:
        if crosses_rack:
            return "rack"
        return "rdma" if kind is LinkKind.RDMA else "tcp"
    return "pcie"


def _implicit_pcie_kind(node: Node, a: int, b: int) -> LinkKind:
    na, nb = node.gpu(a).numa_node, node.gpu(b).numa_node
    return LinkKind.NODE if na is not None and na == nb else LinkKind.SYS


def _pcie_path(node: Node, a: int, b: int, why: str) -> Path:
    kind = _implicit_pcie_kind(node, a, b)
    return Path(kind=kind, tier=tier_of_kind(kind), bandwidth_gb_s=default_bandwidth_gb_s(kind),
                latency_us=default_latency_us(kind), via=f"GPU{a}-GPU{b} {kind.label} ({why})")


def _intra_node(node: Node, a: int, b: int) -> Path:
    link = node.link(a, b)
    if link is None:
        return _pcie_path(node, a, b, "not recorded; assumed from NUMA")
    if link.kind.is_gpu_fabric and not link.health.healthy:
        fallback = _pcie_path(node, a, b, f"{link.kind.label} unhealthy, PCIe is faster")
        if link.effective_bandwidth_gb_s < fallback.bandwidth_gb_s:
            return replace(fallback, healthy=False)  # NCCL would route around a (nearly) dead bond
    lanes = f" NV{link.lanes}" if link.lanes else ""
    return Path(
        kind=link.kind,
        tier=tier_of_kind(link.kind),
        bandwidth_gb_s=link.effective_bandwidth_gb_s,
        latency_us=link.effective_latency_us,
        healthy=link.health.healthy,
        via=f"GPU{a}-GPU{b} {link.kind.label}{lanes}",
    )


def nearest_nic(node: Node, index: int) -> Nic | None:
    """The NIC closest to a GPU: listed as nearest to it, else the best level, then speed."""
    if not node.nics:
        return None
    if any(n.gpu_levels for n in node.nics):  # the source gave every NIC's level to every GPU
        return max(node.nics, key=lambda n: (int(n.level_to(index) or LinkKind.TCP), n.speed_gbit_s or 0.0,
                                              -len(n.nearest_gpus)))
    own = [n for n in node.nics if index in n.nearest_gpus]
    pool = own or list(node.nics)
    return max(pool, key=lambda n: (int(n.level), n.speed_gbit_s or 0.0, -len(n.nearest_gpus)))


def _nic_bandwidth_gb_s(topology: Topology, node: Node, index: int) -> tuple[float, str]:
    nic = nearest_nic(node, index)
    if nic is None:
        return topology.fabric.nic_bandwidth_gb_s, "fabric default"
    bw = nic.speed_gbit_s / 8.0 if nic.speed_gbit_s else topology.fabric.nic_bandwidth_gb_s
    bw *= node.gpu(index).pcie_factor  # a GPU whose PCIe link trained down feeds its NIC slower
    if (nic.level_to(index) or LinkKind.SYS) is LinkKind.SYS:
        # GPUDirect RDMA across the socket link is capped by the socket path.
        bw = min(bw, DEFAULTS[LinkKind.SYS].bandwidth_gb_s)
    return bw, nic.name


def _inter_node(topology: Topology, a: GpuRef, b: GpuRef) -> Path:
    ga, gb = topology.gpu(a), topology.gpu(b)
    if ga.fabric_clique is not None and ga.fabric_clique == gb.fabric_clique:
        bw = min(fabric_clique_bandwidth_gb_s(topology, a), fabric_clique_bandwidth_gb_s(topology, b))
        return Path(
            kind=LinkKind.NVSWITCH,
            tier="nvlink",
            bandwidth_gb_s=bw,
            latency_us=1.0,
            healthy=ga.healthy and gb.healthy,
            via=f"NVLink fabric clique {ga.fabric_clique}",
        )
    fabric = topology.fabric
    na, nb = topology.node(a.node), topology.node(b.node)
    crosses_rack = na.rack is not None and nb.rack is not None and na.rack != nb.rack
    measured = fabric.measured_between(a.node, b.node)
    if measured is not None:  # the benchmark's figure already includes NICs, switches and rack hops
        return Path(kind=fabric.kind, tier=tier_of_kind(fabric.kind, crosses_rack),
                    bandwidth_gb_s=measured.bandwidth_gb_s, latency_us=measured.latency_us,
                    via=f"{fabric.technology} {a.node} -> {b.node} (measured)")
    bw_a, nic_a = _nic_bandwidth_gb_s(topology, na, a.index)
    bw_b, nic_b = _nic_bandwidth_gb_s(topology, nb, b.index)
    # The slower adapter or the network's own port rate (400G NICs on a 25G TCP network: 25G).
    bandwidth, latency = min(bw_a, bw_b, fabric.nic_bandwidth_gb_s), fabric.latency_us
    if crosses_rack:
        bandwidth *= fabric.inter_rack_bandwidth_factor
        latency += fabric.inter_rack_latency_us
    return Path(
        kind=fabric.kind,
        tier=tier_of_kind(fabric.kind, crosses_rack),
        bandwidth_gb_s=bandwidth,
        latency_us=latency,
        via=f"{fabric.technology} {a.node}/{nic_a} -> {b.node}/{nic_b}",
    )


def path(topology: Topology, a: GpuRef, b: GpuRef) -> Path:
    """The path data takes between two GPUs, with its effective bandwidth and latency."""
    if a == b:
        return LOCAL
    if a.node == b.node:
        return _intra_node(topology.node(a.node), a.index, b.index)
    return _inter_node(topology, a, b)


def bottleneck(topology: Topology, gpus: Sequence[GpuRef]) -> Path:
    """The worst pairwise path of a group (a TP group's all-reduce runs at its pace)."""
    worst = LOCAL
    for a, b in combinations(sorted(set(gpus)), 2):
        p = path(topology, a, b)
        if worst is LOCAL or (TIERS.index(p.tier), -p.bandwidth_gb_s) > (
            TIERS.index(worst.tier),
            -worst.bandwidth_gb_s,
        ):
            worst = p
    return worst


def tier(topology: Topology, gpus: Sequence[GpuRef]) -> Tier:
    """The tier of a TP group or of a KV path (prefill GPUs + decode GPUs): its worst pair."""
    return bottleneck(topology, gpus).tier
