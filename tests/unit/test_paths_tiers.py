"""Path bandwidth/latency between any two GPUs and the one tier function."""

from __future__ import annotations

from tests.conftest import ROOT
from topology.model import GpuRef
from topology.paths import bottleneck, path, tier
from topology.readers import read_source

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
