"""Path bandwidth/latency between any two GPUs and the one tier function."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT
from topology.health import GpuCounters, apply_node_health
from topology.model import GpuRef, Topology
from topology.paths import bottleneck, nearest_nic, path, tier
from topology.readers import read_node_text, read_source

pytestmark = pytest.mark.unit

LOCAL = read_source(str(ROOT / "configs/clusters/local-sim.yaml"))
LOW = read_source(str(ROOT / "configs/clusters/low-affinity-pd.yaml"))
DGX1 = read_source("dgx1-v100")


def g(node: str, i: int) -> GpuRef:
    return GpuRef(node, i)


def test_tiers_of_groups() -> None:
    assert tier(LOCAL, [g("h100-0", 0)]) == "local"
    assert tier(LOCAL, [g("h100-0", 0), g("h100-0", 7)]) == "nvlink"
    assert tier(LOCAL, [g("pcie-box", 0), g("pcie-box", 1)]) == "pcie"
    assert tier(LOCAL, [g("pcie-box", 0), g("pcie-box", 4)]) == "numa"
    assert tier(LOCAL, [g("h100-0", 0), g("h100-1", 0)]) == "rdma"
    assert tier(LOCAL, [g("h100-0", 0), g("pcie-box", 0)]) == "rack"
    assert tier(LOW, [g("h100-0", 0), g("h100-1", 0)]) == "tcp"
    # A DGX-1 group inside the island but not a clique runs at its worst pair's pace.
    assert tier(DGX1, [g("node0", 0), g("node0", 1), g("node0", 2), g("node0", 3)]) == "nvlink"
    assert tier(DGX1, [g("node0", 0), g("node0", 1), g("node0", 5)]) == "numa"


def test_path_figures_follow_links_nics_and_health() -> None:
    same = path(LOCAL, g("h100-0", 0), g("h100-0", 1))
    assert same.bandwidth_gb_s == 450.0 and same.latency_us < 1.0
    cross = path(LOCAL, g("h100-0", 0), g("h100-1", 5))
    assert cross.bandwidth_gb_s == 50.0 and "mlx5_ib0" in cross.via and "mlx5_ib5" in cross.via
    rack = path(LOCAL, g("h100-0", 0), g("h100-degraded", 0))
    assert rack.bandwidth_gb_s == 25.0 and rack.latency_us > cross.latency_us
    degraded = path(LOCAL, g("h100-degraded", 2), g("h100-degraded", 3))
    assert not degraded.healthy and degraded.bandwidth_gb_s < 450.0 / 4
    slow = path(LOW, g("h100-0", 0), g("h100-1", 0))
    assert slow.bandwidth_gb_s == 25 / 8


def test_bottleneck_of_a_tp_group_is_its_worst_pair() -> None:
    group = [g("h100-degraded", i) for i in (0, 1, 2, 3)]
    worst = bottleneck(LOCAL, group)
    assert not worst.healthy and worst.bandwidth_gb_s < 100
    print(f"TP=4 on h100-degraded incl. GPU3: bottleneck {worst.bandwidth_gb_s:.1f} GB/s vs 450 GB/s healthy")


def test_nearest_nic_uses_each_gpus_own_level() -> None:
    node = read_node_text((ROOT / "tests/data/two-nics-2numa.txt").read_text())
    chosen = nearest_nic(node, 3)
    assert chosen is not None and chosen.name == "mlx5_1"  # NODE on its own socket, not mlx5_0 across it


def test_pcie_trained_down_slows_the_nic_path_on_nvswitch_boards() -> None:
    sick = apply_node_health(LOCAL.node("h100-0"), {}, {0: GpuCounters(pcie_width=4, pcie_width_max=16)})
    after = Topology(nodes=tuple(sick if n.name == "h100-0" else n for n in LOCAL.nodes), fabric=LOCAL.fabric)
    before_bw = path(LOCAL, g("h100-0", 0), g("h100-1", 0)).bandwidth_gb_s
    after_bw = path(after, g("h100-0", 0), g("h100-1", 0)).bandwidth_gb_s
    assert after_bw == pytest.approx(before_bw / 4)
    assert after.node("h100-0").gpu(0).healthy and "PCIe x4 of x16" in after.node("h100-0").gpu(0).health_reasons[0]
