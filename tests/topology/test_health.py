"""Counters to scores: each signal, the threshold, and what leaves an island."""

from __future__ import annotations

import pytest

from topology.health import GpuCounters, HealthThresholds, LinkCounters, per_minute, score_link
from topology.kinds import LinkKind
from topology.model import Link

pytestmark = pytest.mark.unit

NV = Link(a=0, b=1, kind=LinkKind.NVLINK, lanes=4)
PCIE = Link(a=0, b=1, kind=LinkKind.PIX)
TH = HealthThresholds()


def test_healthy_by_default() -> None:
    h = score_link(NV, LinkCounters(lanes_total=4, lanes_active=4), None, None, TH)
    assert h.healthy and h.score == 1.0 and not h.reasons


@pytest.mark.parametrize(
    ("counters", "score", "healthy"),
    [
        (LinkCounters(lanes_total=4, lanes_active=3), 0.75, True),
        (LinkCounters(lanes_total=4, lanes_active=1), 0.25, False),
        (LinkCounters(lanes_total=4, lanes_active=0), 0.0, False),
        (LinkCounters(replay_per_min=10.0), 0.5, True),
        (LinkCounters(replay_per_min=30.0), 0.25, False),
        (LinkCounters(recovery_per_min=3.0), 0.25, False),
        (LinkCounters(crc_per_min=10.0, replay_per_min=10.0), 0.25, False),
    ],
)
def test_nvlink_signals(counters: LinkCounters, score: float, healthy: bool) -> None:
    h = score_link(NV, counters, None, None, TH)
    assert h.score == pytest.approx(score, abs=1e-3)
    assert h.healthy is healthy
    assert h.reasons


def test_replays_add_latency_and_cut_bandwidth() -> None:
    h = score_link(NV, LinkCounters(replay_per_min=10.0), None, None, TH)
    link = Link(a=0, b=1, kind=LinkKind.NVLINK, lanes=4, health=h)
    assert link.effective_bandwidth_gb_s == pytest.approx(link.bandwidth_gb_s / 2)
    assert link.effective_latency_us == pytest.approx(2 * link.latency_us)


def test_pcie_width_counts_always_generation_only_under_load() -> None:
    narrow = GpuCounters(pcie_width=8, pcie_width_max=16)
    assert score_link(PCIE, None, narrow, None, TH).score == 0.5
    idle_gen = GpuCounters(pcie_generation=1, pcie_generation_max=4)
    assert score_link(PCIE, None, idle_gen, None, TH).score == 1.0
    busy_gen = GpuCounters(pcie_generation=3, pcie_generation_max=4, under_load=True)
    assert score_link(PCIE, None, busy_gen, None, TH).score == pytest.approx(0.5)
    # PCIe signals do not touch an NVLink bond, and NVLink XIDs do not touch a PCIe path.
    assert score_link(NV, None, narrow, None, TH).score == 1.0
    assert score_link(PCIE, None, GpuCounters(xids=(74,)), None, TH).score == 1.0


def test_xid_74_and_fabric_mask() -> None:
    assert not score_link(NV, None, GpuCounters(xids=(74,)), None, TH).healthy
    degraded = score_link(NV, None, None, GpuCounters(fabric_health_mask=1), TH)
    assert degraded.healthy and degraded.bandwidth_factor == 0.5


def test_thresholds_are_configuration() -> None:
    strict = HealthThresholds(nvlink_replay_per_min=1.0, min_healthy_score=0.9)
    assert not score_link(NV, LinkCounters(replay_per_min=1.0), None, None, strict).healthy
    assert score_link(NV, LinkCounters(replay_per_min=1.0), None, None, TH).healthy


def test_counter_rates_and_resets() -> None:
    assert per_minute(100, 130, 30.0) == 60.0
    assert per_minute(100, 5, 60.0) == 5.0  # counter reset: count from zero
    assert per_minute(1, 2, 0.0) == 0.0
