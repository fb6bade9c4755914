"""Cases a review found: each once wrong, now pinned."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import captures, run_cli
from topology import GpuRef, path, read_source
from topology.diff import diff
from topology.health import GpuCounters, apply_node_health
from topology.model import Topology
from topology.paths import nearest_nic
from topology.readers import read_node_text

TWO_NICS = (
    "\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\n"
    "GPU0\t X \tNV4\tSYS\tSYS\tPIX\tSYS\t0-7\t0\n"
    "GPU1\tNV4\t X \tSYS\tSYS\tPXB\tSYS\t0-7\t0\n"
    "GPU2\tSYS\tSYS\t X \tNV4\tSYS\tPIX\t8-15\t1\n"
    "GPU3\tSYS\tSYS\tNV4\t X \tSYS\tNODE\t8-15\t1\n"
    "NIC0\tPIX\tPXB\tSYS\tSYS\t X \tSYS\n"
    "NIC1\tSYS\tSYS\tPIX\tNODE\tSYS\t X \n\nNIC Legend:\n\n  NIC0: mlx5_0\n  NIC1: mlx5_1\n"
)


def test_nearest_nic_uses_each_gpus_own_level() -> None:
    node = read_node_text(TWO_NICS)
    chosen = nearest_nic(node, 3)
    assert chosen is not None and chosen.name == "mlx5_1"  # NODE on its own socket, not mlx5_0 across it


def test_nic_moving_to_another_gpu_is_reported() -> None:
    moved = TWO_NICS.replace("GPU0\t X \tNV4\tSYS\tSYS\tPIX", "GPU0\t X \tNV4\tSYS\tSYS\tPXB").replace(
        "GPU1\tNV4\t X \tSYS\tSYS\tPXB", "GPU1\tNV4\t X \tSYS\tSYS\tPIX").replace(
        "NIC0\tPIX\tPXB", "NIC0\tPXB\tPIX")
    changes = diff(Topology(nodes=(read_node_text(TWO_NICS),)), Topology(nodes=(read_node_text(moved),)))
    assert [c.what for c in changes if c.worse] == ["nearest GPUs [0] -> [1] (PIX)"]


def test_one_pair_training_down_is_one_change() -> None:
    capture = next(iter(captures("hgx-h100*.txt")), None)
    if capture is None:
        pytest.skip("shared/data not present")
    text = capture.read_text()
    lines = text.splitlines()
    lines[1] = lines[1].replace("NV18", "NV16", 1)  # GPU0-GPU1
    lines[2] = lines[2].replace("NV18", "NV16", 1)  # GPU1-GPU0
    changes = diff(Topology(nodes=(read_node_text(text),)), Topology(nodes=(read_node_text("\n".join(lines)),)))
    assert [(c.subject, c.what) for c in changes if c.worse] == [("GPU0-GPU1", "nvlink NV18 -> nvlink NV16")]


def test_pcie_trained_down_slows_the_nic_path_on_nvswitch_boards() -> None:
    topo = read_source("configs/clusters/local-sim.yaml")
    node = topo.node("h100-0")
    sick = apply_node_health(node, {}, {0: GpuCounters(pcie_width=4, pcie_width_max=16)})
    after = Topology(nodes=tuple(sick if n.name == "h100-0" else n for n in topo.nodes), fabric=topo.fabric)
    before_bw = path(topo, GpuRef("h100-0", 0), GpuRef("h100-1", 0)).bandwidth_gb_s
    after_bw = path(after, GpuRef("h100-0", 0), GpuRef("h100-1", 0)).bandwidth_gb_s
    assert after_bw == pytest.approx(before_bw / 4)
    assert after.node("h100-0").gpu(0).healthy and "PCIe x4 of x16" in after.node("h100-0").gpu(0).health_reasons[0]


def test_dead_nvlink_falls_back_to_pcie_and_sizing_works(tmp_path: Path) -> None:
    spec = tmp_path / "d.yaml"
    spec.write_text("nodes:\n  - name: a\n    template: hgx-h100\n"
                    "    degraded_links: [{gpus: [1, 2], lanes_active: 0}]\n")
    topo = read_source(str(spec))
    p = path(topo, GpuRef("a", 1), GpuRef("a", 2))
    assert p.bandwidth_gb_s > 0 and p.tier == "pcie" and not p.healthy
    result = run_cli("parse", str(spec))
    assert result.returncode == 0
    import subprocess
    import sys

    from tests.conftest import ROOT

    size = subprocess.run([sys.executable, "-m", "pools", "size", "--topology", str(spec), "--model", "llama-3.1-70b",
                           "--workload", "azure-conv", "--slo", "interactive"], cwd=ROOT, capture_output=True,
                          text=True, check=False)
    assert size.returncode == 0, size.stderr


@pytest.mark.parametrize(("content", "message"), [
    (None, "cannot read plan"), ("[1, 2]", "placements"), ('{"placements": [{"node": "n", "gpus": [[0]]}]}',
                                                           "placements"), ("{", "not JSON")])
def test_show_plan_errors_are_one_line(tmp_path: Path, content: str | None, message: str) -> None:
    plan = tmp_path / "plan.json"
    if content is not None:
        plan.write_text(content)
    result = run_cli("show", "a30-pairs", "--out", str(tmp_path / "x.svg"), "--plan", str(plan))
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_deep_nccl_xml_and_badly_typed_json_are_parse_errors(tmp_path: Path) -> None:
    deep = "<system><cpu numaid='0'>" + "<pci busid='0000:00:01.0'>" * 3000 + "</pci>" * 3000 + "</cpu></system>"
    (tmp_path / "deep.xml").write_text(deep)
    doc = {"source_format": "x", "gpus": [{"index": "x"}, {"index": 0}], "links": [], "nics": []}
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    doc2 = {"gpus": [{"index": 0}], "links": [], "nics": [{"name": "n", "nearest_gpus": [5], "level": "pix"}]}
    (tmp_path / "nic.json").write_text(json.dumps(doc2))
    for name in ("deep.xml", "bad.json", "nic.json"):
        result = run_cli("parse", str(tmp_path / name), "--format", "json")
        assert result.returncode == 2 and "Traceback" not in result.stderr, (name, result.stderr)
