"""The cost-model facts routing reads: tier quality follows the cost model inside a node, a TP
group is priced over its worst link (a named fallback without a topology), and a KV handover
moves rank by rank, sharing the carriers two ranks have in common."""

from __future__ import annotations

import pytest

from physics import catalog, costmodel, kvtransfer
from physics.costmodel import TIER_QUALITY, LinkCost
from topology import GpuRef, LinkKind, Path, bottleneck, read_source
from topology.kinds import DEFAULTS

pytestmark = pytest.mark.unit
MODEL, GPU = catalog.model("llama-3.1-8b"), catalog.gpu("h100-sxm")


def _speed(kind: LinkKind) -> float:
    """Prefill throughput over `kind`'s default link relative to NVSwitch (the docstring's measure)."""
    def ms(k: LinkKind) -> float:
        d = DEFAULTS[k]
        link = LinkCost.of(Path(kind=k, tier="pcie", bandwidth_gb_s=d.bandwidth_gb_s, latency_us=d.latency_us))
        return costmodel.prefill_ms(MODEL, GPU, 2, link, 8192)
    return ms(LinkKind.NVSWITCH) / ms(kind)


def test_tier_quality_is_the_cost_models_ratio_inside_a_node_and_lower_across_nodes() -> None:
    assert _speed(LinkKind.NODE) <= TIER_QUALITY["pcie"] <= _speed(LinkKind.PIX)
    assert TIER_QUALITY["numa"] == pytest.approx(_speed(LinkKind.SYS), abs=0.05)
    assert TIER_QUALITY["rdma"] < _speed(LinkKind.RDMA) and TIER_QUALITY["tcp"] < _speed(LinkKind.TCP)


def test_a_tp_group_is_priced_over_its_worst_link() -> None:
    topo = read_source("configs/clusters/local-sim.yaml")
    refs = [GpuRef("h100-degraded", g) for g in (0, 2, 3)]
    assert costmodel.group_link(topo, refs, 3) == LinkCost.of(bottleneck(topo, refs))
    assert costmodel.group_link(topo, refs[:1], 1) == costmodel.LOCAL
    assert costmodel.group_link(None, refs, 3) == costmodel.TP_LINK_FALLBACK
    assert costmodel.group_link(topo, [GpuRef("nowhere", 0), GpuRef("nowhere", 1)], 2) == costmodel.TP_LINK_FALLBACK


def test_kv_ranks_move_at_once_and_share_a_common_carrier() -> None:
    def link(via: str, bandwidth: float) -> Path:
        return Path(kind=LinkKind.RDMA, tier="rdma", bandwidth_gb_s=bandwidth, latency_us=3.0, via=via)

    whole = kvtransfer.kv_handover_ms(MODEL, 8000, [link("a", 50.0)])
    apart = kvtransfer.kv_handover_ms(MODEL, 8000, [link("a", 50.0), link("b", 50.0)])
    shared = kvtransfer.kv_handover_ms(MODEL, 8000, [link("a", 50.0), link("a", 50.0)])
    # the path's latency, the network transfer's setup and each rank's per-layer requests (ranks on
    # one NIC queue theirs: `shared` pays twice a rank's requests)
    setup = 3e-3 + kvtransfer.KV_SETUP_MS + kvtransfer.kv_requests_ms(MODEL, [link("a", 50.0)])
    assert apart == pytest.approx((whole - setup) / 2 + setup)
    assert shared == pytest.approx(whole + kvtransfer.kv_requests_ms(MODEL, [link("a", 50.0)]))
    assert kvtransfer.kv_handover_ms(MODEL, 8000, [link("slow", 1.0)]) > whole
    local = Path(kind=LinkKind.NVSWITCH, tier="local", bandwidth_gb_s=float("inf"), latency_us=0.0)
    assert kvtransfer.kv_handover_ms(MODEL, 8000, [local]) == 0.0
