"""Live discovery against a fake NVML reproducing four real machines (no driver exists here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import fake_nvml
from topology.errors import DiscoveryError
from topology.export import node_capture
from topology.islands import islands
from topology.kinds import LinkKind
from topology.model import Topology
from topology.paths import path as gpu_path
from topology.readers.nvml import discover

pytestmark = pytest.mark.unit


def _discover(nvml: fake_nvml.FakeNvml, root: Path, sample_s: float = 0.0) -> Topology:
    node = discover(nvml=nvml, sysfs_root=root, sample_s=sample_s, sleep=nvml.advance)
    return Topology(nodes=(node,))


def test_hgx_h100_is_one_nvswitch_island_with_rail_nics(tmp_path: Path) -> None:
    nvml = fake_nvml.hgx_h100()
    nics = {f"mlx5_{i}": (f"0000:{0x19 + 0x10 * i:02x}:00.0", i, "400 Gb/sec (4X NDR)", "InfiniBand") for i in range(8)}
    fake_nvml.write_sysfs(tmp_path, nvml, nics)
    topology = _discover(nvml, tmp_path)
    got = node_capture(topology.nodes[0])
    assert got["islands"] == [list(range(8))] and got["cliques"] == [list(range(8))]
    node = topology.nodes[0]
    assert {k.kind for k in node.links} == {LinkKind.NVSWITCH} and {k.lanes for k in node.links} == {18}
    assert node.gpu(0).pci_bus_id == "0000:18:00.0" and node.gpu(5).numa_node == 1
    assert node.gpu(4).cpu_affinity == "56-111" and node.gpu(0).nvlink_generation == 4
    assert [(n.name, n.nearest_gpus, n.level) for n in node.nics][:2] == [
        ("mlx5_0", (0,), LinkKind.PIX), ("mlx5_1", (1,), LinkKind.PIX)]
    assert {n.speed_gbit_s for n in node.nics} == {400.0} and node.nics[0].link_layer == "infiniband"
    assert all(k.health.healthy and not k.health.reasons for k in node.links)


def test_dgx1_peers_give_the_hybrid_cube_mesh(tmp_path: Path) -> None:
    nvml = fake_nvml.dgx1()
    fake_nvml.write_sysfs(tmp_path, nvml, {"mlx5_0": ("0000:0c:00.0", 2, "100 Gb/sec (4X EDR)", "InfiniBand")})
    node = _discover(nvml, tmp_path).nodes[0]
    got = node_capture(node)
    assert got["islands"] == [list(range(8))]
    assert got["cliques"] == [[0, 1, 2, 3], [0, 4], [1, 5], [2, 6], [3, 7], [4, 5, 6, 7]]
    assert node.link(0, 3).lanes == 2 and node.link(0, 1).lanes == 1  # type: ignore[union-attr]
    assert node.link(0, 5).kind is LinkKind.SYS  # type: ignore[union-attr]
    assert node.link(0, 3).bandwidth_gb_s == 50.0  # type: ignore[union-attr]  # NVLink 2: 25 GB/s per lane
    assert got["nics"] == [{"name": "mlx5_0", "nearest_gpus": [2], "level": "PIX"}]


def test_pcie_box_has_singleton_islands_and_no_p2p_bandwidth(tmp_path: Path) -> None:
    nvml = fake_nvml.pcie_box()
    fake_nvml.write_sysfs(tmp_path, nvml, {})
    topology = _discover(nvml, tmp_path)
    got = node_capture(topology.nodes[0])
    assert got["islands"] == [[i] for i in range(8)] and got["cliques"] == []
    kinds = {(k["a"], k["b"]): k["kind"] for k in got["links"]}
    assert kinds[(0, 1)] == "node" and kinds[(0, 4)] == "sys"
    same_socket = gpu_path(topology, topology.gpu_refs()[0], topology.gpu_refs()[1])
    assert same_socket.tier == "pcie" and same_socket.bandwidth_gb_s <= 15.0  # P2P unsupported: staged via host


def test_degraded_gpu_leaves_the_island_after_a_sample(tmp_path: Path) -> None:
    nvml = fake_nvml.hgx_h100(degraded_gpu=3, replay_per_min=45.0, active_ports=9)
    fake_nvml.write_sysfs(tmp_path, nvml, {})
    topology = _discover(nvml, tmp_path, sample_s=60.0)  # fake time: no real wait
    node = topology.nodes[0]
    link = node.link(2, 3)
    assert link is not None and not link.health.healthy
    assert link.lanes == 18
    assert link.health.score == pytest.approx(0.5 * 1 / (1 + 45 / 10), rel=0.01)
    assert any("lanes 9/18" in r for r in link.health.reasons) and any("replay 45" in r for r in link.health.reasons)
    assert link.effective_bandwidth_gb_s < link.bandwidth_gb_s / 4
    assert node.link(0, 1).health.healthy  # type: ignore[union-attr]
    assert [sorted(g.index for g in i.gpus) for i in islands(topology)] == [[0, 1, 2, 4, 5, 6, 7], [3]]


def test_inactive_lanes_alone_are_seen_without_sampling(tmp_path: Path) -> None:
    nvml = fake_nvml.hgx_h100(degraded_gpu=5, active_ports=6)
    fake_nvml.write_sysfs(tmp_path, nvml, {})
    node = _discover(nvml, tmp_path).nodes[0]
    assert not node.link(4, 5).health.healthy  # type: ignore[union-attr]  # 6/18 lanes -> score 0.33


def test_xid_79_marks_the_gpu_lost(tmp_path: Path) -> None:
    nvml = fake_nvml.hgx_h100()
    nvml.pending_xids = [(6, 79)]
    fake_nvml.write_sysfs(tmp_path, nvml, {})
    topology = _discover(nvml, tmp_path, sample_s=1.0)
    gpu = topology.nodes[0].gpu(6)
    assert not gpu.healthy and "XID 79" in gpu.health_reasons[0]
    assert [6] in [[g.index for g in i.gpus] for i in islands(topology)]


def test_gb200_trays_sharing_a_fabric_clique_form_one_island(tmp_path: Path) -> None:
    trays = []
    for t in range(2):
        nvml = fake_nvml.gb200_tray(t)
        fake_nvml.write_sysfs(tmp_path / f"t{t}", nvml, {})
        trays.append(discover(node_name=f"tray{t}", nvml=nvml, sysfs_root=tmp_path / f"t{t}"))
    topology = Topology(nodes=tuple(trays))
    found = islands(topology)
    assert len(found) == 1 and found[0].size == 8 and found[0].fully_connected
    a, b = topology.gpu_refs()[0], topology.gpu_refs()[-1]
    assert gpu_path(topology, a, b).tier == "nvlink"


def test_no_driver_is_a_clear_discovery_error() -> None:
    with pytest.raises(DiscoveryError, match=r"NVML unavailable on this machine .NVML Shared Library Not Found."):
        discover(nvml=fake_nvml.FakeNvml([], {}, driver=False))


def test_the_pci_device_id_names_the_catalogue_model(tmp_path: Path) -> None:
    """A real H200 calls itself 'NVIDIA H200' (seen on the GPU check machine); its PCI device id
    0x2335 says which catalogue model that is, so placement and the cost model can use it."""
    nvml = fake_nvml.hgx_h100()
    for g in nvml.gpus:
        g.name, g.device_id = "NVIDIA H200", 0x2335
    nvml.gpus[6].device_id = 0xFFFE  # an id the catalogue lacks, but the name reads as its h200-sxm
    nvml.gpus[7].device_id = 0xFFFF  # neither id nor name is the catalogue's (a PCIe card): NVML's name stays
    nvml.gpus[7].name = "NVIDIA H200 NVL"
    fake_nvml.write_sysfs(tmp_path, nvml, {})
    node = _discover(nvml, tmp_path).nodes[0]
    assert [g.model for g in node.gpus] == ["h200-sxm"] * 7 + ["NVIDIA H200 NVL"]
