"""Link kinds, ordered worst to best, with default bandwidth and latency per kind.

The order is the one DESIGN.md fixes: tcp < rdma < sys < node < phb < pxb < pix < xgmi/nvlink
< nvswitch. Within NVLink and XGMI more lanes is better; `rank()` folds lanes in so that two
links can be compared with one key.

Every default below says where it comes from. Bandwidths are per direction, in GB/s (bytes),
because that is what a KV transfer or a ring all-reduce pays; NIC speeds are quoted by
vendors in Gb/s (bits) and converted once, here. Measured values (issue 8's bench) override
these defaults on the `Link` itself.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class LinkKind(enum.IntEnum):
    """How two devices are connected, worst (0) to best."""

    TCP = 0  # different nodes, TCP/IP
    RDMA = 1  # different nodes, InfiniBand or RoCE
    SYS = 2  # PCIe plus the inter-socket link (QPI/UPI/xGMI-socket)
    NODE = 3  # PCIe plus host bridges inside one NUMA node
    PHB = 4  # PCIe through one host bridge
    PXB = 5  # several PCIe bridges, no host bridge
    PIX = 6  # at most one PCIe bridge
    XGMI = 7  # AMD Infinity Fabric between GPUs
    NVLINK = 8  # direct NVLink bonds between two GPUs (bridge or mesh)
    NVSWITCH = 9  # NVLink through NVSwitch chips (all-to-all at full per-GPU bandwidth)

    @property
    def label(self) -> str:
        """Lower-case name as the capture schema writes it (`nvswitch` prints as `nvlink`)."""
        return "nvlink" if self is LinkKind.NVSWITCH else self.name.lower()

    @property
    def is_gpu_fabric(self) -> bool:
        """True for the kinds that form islands (NVLink, NVSwitch, XGMI)."""
        return int(self) >= _XGMI  # plain ints: enum member lookups are slow on hot paths

    @property
    def is_network(self) -> bool:
        return int(self) <= _RDMA

    @classmethod
    def parse(cls, text: str) -> LinkKind:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            names = ", ".join(k.name.lower() for k in cls)
            raise ValueError(f"unknown link kind {text!r} (one of: {names})") from None


_XGMI = int(LinkKind.XGMI)
_RDMA = int(LinkKind.RDMA)


def rank(kind: LinkKind, lanes: int | None) -> tuple[int, int]:
    """Sort key: kind first, then lane count (NV12 beats NV4 of the same kind)."""
    return (int(kind), lanes or 0)


@dataclass(frozen=True, slots=True, kw_only=True)
class KindDefault:
    bandwidth_gb_s: float
    latency_us: float
    source: str


NVLINK_LANE_GB_S: dict[int, float] = {
    # NVLink generation -> GB/s per lane per direction. NVLink 2, 3 and 4 carry 50 GB/s per
    # bidirectional link (25 per direction); NVLink 5 doubles that. Source: NVIDIA NVLink
    # product text and the per-generation table in shared/research/nvml-topology-api.md §4
    # (V100 6 links = 300 GB/s, A100 12 = 600 GB/s, H100 18 = 900 GB/s, B200 18 = 1.8 TB/s).
    1: 20.0,
    2: 25.0,
    3: 25.0,
    4: 25.0,
    5: 50.0,
}
DEFAULT_NVLINK_GENERATION = 4

PCIE_X16_GB_S: dict[int, float] = {
    # PCIe generation -> GB/s per direction for x16: GT/s x 16 lanes x 128/130 / 8.
    # Gen3 8 GT/s, Gen4 16 GT/s, Gen5 32 GT/s, Gen6 64 GT/s (PCI-SIG base specifications).
    3: 15.75,
    4: 31.5,
    5: 63.0,
    6: 121.0,
}
DEFAULT_PCIE_GENERATION = 4

_NCCL_LAT = (
    "NCCL src/graph/tuning.cc hwLat table (Ring/LL: NVLink ~0.5 us, PCI ~1 us, NET ~2.7 us "
    "per hop)"
)

DEFAULTS: dict[LinkKind, KindDefault] = {
    LinkKind.NVSWITCH: KindDefault(
        bandwidth_gb_s=18 * NVLINK_LANE_GB_S[4],
        latency_us=0.5,
        source="H100 SXM: 18 NVLink-4 links x 25 GB/s/dir = 450 GB/s/dir; latency " + _NCCL_LAT,
    ),
    LinkKind.NVLINK: KindDefault(
        bandwidth_gb_s=NVLINK_LANE_GB_S[4],
        latency_us=0.5,
        source="one NVLink lane 25 GB/s/dir (NVLink 2-4); scaled by lanes; latency " + _NCCL_LAT,
    ),
    LinkKind.XGMI: KindDefault(
        bandwidth_gb_s=64.0,
        latency_us=0.7,
        source="AMD Instinct MI300X data sheet: 128 GB/s bidirectional per Infinity Fabric "
        "link between two GPUs (64 GB/s/dir); a part whose links run faster says so "
        "(topology/data/gpus.yaml xgmi_link_gb_s: MI350X/MI355X 76.8)",
    ),
    LinkKind.PIX: KindDefault(
        bandwidth_gb_s=PCIE_X16_GB_S[4],
        latency_us=1.0,
        source="PCIe Gen4 x16 through one switch (31.5 GB/s/dir); latency " + _NCCL_LAT,
    ),
    LinkKind.PXB: KindDefault(
        bandwidth_gb_s=PCIE_X16_GB_S[4],
        latency_us=1.3,
        source="PCIe Gen4 x16 through several switches; +0.3 us per extra switch hop "
        "(PCIe switch port-to-port latency ~100-150 ns each way, Broadcom PEX88000 brief)",
    ),
    LinkKind.PHB: KindDefault(
        bandwidth_gb_s=0.8 * PCIE_X16_GB_S[4],
        latency_us=2.0,
        source="PCIe through the CPU root complex: ~80% of x16 for P2P "
        "(p2pBandwidthLatencyTest figures, shared/research/nvml-topology-api.md §4)",
    ),
    LinkKind.NODE: KindDefault(
        bandwidth_gb_s=0.7 * PCIE_X16_GB_S[4],
        latency_us=3.0,
        source="PCIe across host bridges of one socket: ~70% of x16 (same measurements)",
    ),
    LinkKind.SYS: KindDefault(
        bandwidth_gb_s=15.0,
        latency_us=6.0,
        source="P2P staged through host memory across the socket link: 10-20 GB/s measured "
        "on 8x A100 with P2P disabled (LLMServe/DistServe issue #3)",
    ),
    LinkKind.RDMA: KindDefault(
        bandwidth_gb_s=50.0,
        latency_us=3.0,
        source="InfiniBand NDR 400 Gb/s per NIC = 50 GB/s (ConnectX-7); latency " + _NCCL_LAT,
    ),
    LinkKind.TCP: KindDefault(
        bandwidth_gb_s=12.5,
        latency_us=30.0,
        source="100 GbE TCP = 12.5 GB/s; kernel TCP round trip ~25-50 us on loopback-free "
        "data-centre paths (NCCL socket transport)",
    ),
}


def default_bandwidth_gb_s(
    kind: LinkKind,
    lanes: int | None = None,
    nvlink_generation: int | None = None,
    pcie_generation: int | None = None,
    *,
    xgmi_link_gb_s: float | None = None,
) -> float:
    """Nominal per-direction bandwidth of a link of this kind (`xgmi_link_gb_s`: the GPU's Infinity
    Fabric link rate where it is not MI300X's, topology/data/gpus.yaml)."""
    if kind in (LinkKind.NVLINK, LinkKind.NVSWITCH):
        per_lane = NVLINK_LANE_GB_S.get(nvlink_generation or DEFAULT_NVLINK_GENERATION, 25.0)
        return per_lane * (lanes or (18 if kind is LinkKind.NVSWITCH else 1))
    if kind in (LinkKind.PIX, LinkKind.PXB, LinkKind.PHB, LinkKind.NODE) and pcie_generation:
        scale = DEFAULTS[kind].bandwidth_gb_s / PCIE_X16_GB_S[DEFAULT_PCIE_GENERATION]
        return scale * PCIE_X16_GB_S.get(pcie_generation, PCIE_X16_GB_S[DEFAULT_PCIE_GENERATION])
    if kind is LinkKind.XGMI and xgmi_link_gb_s:
        return xgmi_link_gb_s
    return DEFAULTS[kind].bandwidth_gb_s


def default_latency_us(kind: LinkKind) -> float:
    return DEFAULTS[kind].latency_us
