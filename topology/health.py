"""Link health: from NVML counters to a score per link and an effective bandwidth.

Each signal multiplies the link's score (1.0 healthy) by a factor in [0, 1]:

- lanes: `active / total` NVLink lanes (a bond trained down carries proportionally less);
  no active lane is a dead link (score 0);
- error rates per minute (NVLink replay, recovery, CRC; PCIe replay): `1 / (1 + rate/limit)`,
  so a rate equal to its limit halves the score; the same factor scales bandwidth and the
  inverse adds latency (every replay stalls the link);
- PCIe width below the maximum, and generation below the maximum when the GPU is under load
  (idle GPUs drop their link generation to save power, so an idle gen drop is not a fault);
- the NVLink fabric health mask (degraded bandwidth) halves NVLink bandwidth;
- critical XID events: 74 (NVLink error) takes the GPU's NVLinks below the threshold, 79
  (fell off the bus) and the other critical XIDs mark the GPU itself unhealthy.

A link whose score is below `min_healthy_score` is unhealthy and leaves its island. The
thresholds are configuration (`HealthThresholds`), with the defaults documented here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from topology.kinds import PCIE_X16_GB_S, LinkKind
from topology.model import Gpu, GpuRef, Link, LinkHealth, Node, Topology

XID_NVLINK_ERROR = 74
XID_FELL_OFF_BUS = 79
FABRIC_HEALTH_DEGRADED_BW = 0x1
"""NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE (nvmlGpuFabricInfo_v2+)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HealthThresholds:
    nvlink_replay_per_min: float = 10.0
    """NVLink DL replays per minute at which a link's score halves."""
    nvlink_recovery_per_min: float = 1.0
    """NVLink recoveries per minute (link retrain) at which the score halves."""
    nvlink_crc_per_min: float = 10.0
    """NVLink CRC flit+data errors per minute at which the score halves."""
    pcie_replay_per_min: float = 10.0
    """PCIe replay counter increments per minute at which a PCIe path's score halves."""
    min_healthy_score: float = 0.5
    """Below this a link is unhealthy: it leaves its island and TP groups avoid it."""
    degraded_fabric_factor: float = 0.5
    """Bandwidth share left when the fabric health mask reports degraded bandwidth."""
    nvlink_error_xid_factor: float = 0.25
    """Score factor for a GPU's NVLinks after XID 74."""
    gpu_critical_xids: tuple[int, ...] = (48, 79, 92, 94, 95, 119, 120, 140)
    """XIDs that mark the GPU itself unhealthy (DBE, fell off bus, ECC, GSP errors)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkCounters:
    """What NVML says about one GPU pair's NVLink bond (rates per minute)."""

    lanes_total: int | None = None
    lanes_active: int | None = None
    replay_per_min: float = 0.0
    recovery_per_min: float = 0.0
    crc_per_min: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuCounters:
    """Per-GPU signals: PCIe training and errors, XIDs, fabric health."""

    pcie_generation: int | None = None
    pcie_generation_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    pcie_replay_per_min: float = 0.0
    under_load: bool = False
    xids: tuple[int, ...] = ()
    fabric_health_mask: int = 0


@dataclass(slots=True)
class _Score:
    score: float = 1.0
    bandwidth: float = 1.0
    latency_mult: float = 1.0
    reasons: list[str] | None = None

    def apply(self, factor: float, reason: str, bandwidth: bool = True, latency: bool = False) -> None:
        self.score *= factor
        if bandwidth:
            self.bandwidth *= factor
        if latency and factor > 0:
            self.latency_mult /= factor
        if self.reasons is None:
            self.reasons = []
        self.reasons.append(reason)


def _rate(s: _Score, rate: float, limit: float, what: str) -> None:
    if rate > 0:
        s.apply(1.0 / (1.0 + rate / limit), f"{what} {rate:g}/min (halves at {limit:g}/min)", latency=True)


def _nvlink_signals(s: _Score, c: LinkCounters, th: HealthThresholds) -> None:
    if c.lanes_total and c.lanes_active is not None and c.lanes_active < c.lanes_total:
        s.apply(c.lanes_active / c.lanes_total, f"NVLink lanes {c.lanes_active}/{c.lanes_total} active")
    _rate(s, c.replay_per_min, th.nvlink_replay_per_min, "NVLink replay")
    _rate(s, c.recovery_per_min, th.nvlink_recovery_per_min, "NVLink recovery")
    _rate(s, c.crc_per_min, th.nvlink_crc_per_min, "NVLink CRC errors")


def _gpu_signals(s: _Score, kind: LinkKind, gpu: int, c: GpuCounters, th: HealthThresholds) -> None:
    if kind.is_gpu_fabric:
        if XID_NVLINK_ERROR in c.xids:
            s.apply(th.nvlink_error_xid_factor, f"GPU{gpu} XID 74 (NVLink error)")
        if c.fabric_health_mask & FABRIC_HEALTH_DEGRADED_BW:
            s.apply(th.degraded_fabric_factor, f"GPU{gpu} fabric reports degraded bandwidth")
        return
    if c.pcie_width and c.pcie_width_max and c.pcie_width < c.pcie_width_max:
        s.apply(c.pcie_width / c.pcie_width_max, f"GPU{gpu} PCIe x{c.pcie_width} of x{c.pcie_width_max}")
    gen, gen_max = c.pcie_generation, c.pcie_generation_max
    if c.under_load and gen and gen_max and gen < gen_max:
        factor = PCIE_X16_GB_S.get(gen, 1.0) / PCIE_X16_GB_S.get(gen_max, 1.0)
        s.apply(factor, f"GPU{gpu} PCIe Gen{gen} of Gen{gen_max} under load")
    _rate(s, c.pcie_replay_per_min, th.pcie_replay_per_min, f"GPU{gpu} PCIe replay")


def score_link(
    link: Link,
    counters: LinkCounters | None,
    gpu_a: GpuCounters | None,
    gpu_b: GpuCounters | None,
    thresholds: HealthThresholds,
) -> LinkHealth:
    s = _Score()
    if counters is not None and link.kind.is_gpu_fabric:
        if counters.lanes_active == 0:
            return LinkHealth(score=0.0, healthy=False, bandwidth_factor=0.0,
                              reasons=("all NVLink lanes inactive",))
        _nvlink_signals(s, counters, thresholds)
    for gpu, c in ((link.a, gpu_a), (link.b, gpu_b)):
        if c is not None:
            _gpu_signals(s, link.kind, gpu, c, thresholds)
    if not s.reasons:
        return LinkHealth()
    return LinkHealth(
        score=round(s.score, 4),
        healthy=s.score >= thresholds.min_healthy_score,
        bandwidth_factor=round(s.bandwidth, 4),
        added_latency_us=round(link.latency_us * (s.latency_mult - 1.0), 3),
        reasons=tuple(s.reasons),
    )


def gpu_health(gpu: Gpu, c: GpuCounters | None, thresholds: HealthThresholds) -> Gpu:
    if c is None:
        return gpu
    pcie = _Score()
    _gpu_signals(pcie, LinkKind.PIX, gpu.index, c, thresholds)  # the GPU's own PCIe link
    bad = [x for x in c.xids if x in thresholds.gpu_critical_xids]
    reasons = tuple(f"XID {x}" + (" (fell off the bus)" if x == XID_FELL_OFF_BUS else "") for x in bad)
    if not bad and not pcie.reasons:
        return gpu
    return replace(gpu, healthy=not bad, health_reasons=reasons + tuple(pcie.reasons or ()),
                   pcie_factor=round(pcie.bandwidth, 4))


def apply_node_health(
    node: Node,
    links: Mapping[tuple[int, int], LinkCounters],
    gpus: Mapping[int, GpuCounters],
    thresholds: HealthThresholds | None = None,
) -> Node:
    """A new node whose links and GPUs carry the health these counters imply."""
    th = thresholds or HealthThresholds()
    new_links = tuple(
        replace(k, health=score_link(k, links.get((k.a, k.b)), gpus.get(k.a), gpus.get(k.b), th))
        for k in node.links
    )
    new_gpus = tuple(gpu_health(g, gpus.get(g.index), th) for g in node.gpus)
    return replace(node, links=new_links, gpus=new_gpus)


def apply_health(
    topology: Topology,
    links: Mapping[tuple[str, int, int], LinkCounters],
    gpus: Mapping[GpuRef, GpuCounters],
    thresholds: HealthThresholds | None = None,
) -> Topology:
    nodes = []
    for node in topology.nodes:
        node_links = {(a, b): c for (n, a, b), c in links.items() if n == node.name}
        node_gpus = {ref.index: c for ref, c in gpus.items() if ref.node == node.name}
        nodes.append(apply_node_health(node, node_links, node_gpus, thresholds) if node_links or node_gpus else node)
    return replace(topology, nodes=tuple(nodes))


def per_minute(before: int, after: int, seconds: float) -> float:
    """Counter increase as a rate; a counter that went backwards was reset (count from 0)."""
    if seconds <= 0:
        return 0.0
    delta = after - before if after >= before else after
    return delta * 60.0 / seconds
