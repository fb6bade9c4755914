"""Every NCCL topology XML reads into the machine its .source.md describes: islands and NICs."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import shared_path
from tests.topology.conftest import run_cli
from topology.export import node_capture
from topology.kinds import LinkKind
from topology.readers import ReadOptions, read_node_text
from topology.readers.nccl import NcclHints, parse_nccl, platform_of

pytestmark = pytest.mark.unit

# Facts from each file's .source.md. `gpu` is what the operator knows about the VM size and
# the file does not say (static files leave NVLink to NCCL's run-time NVML probe).
MACHINES: dict[str, dict[str, Any]] = {
    "ibm-cloud-gx3d-8xh100-topo": {
        "gpu": None, "islands": [list(range(8))], "numa": [0, 0, 0, 0, 1, 1, 1, 1],
        "nics": {f"mlx5_{7 - i}": ([i], "PIX") for i in range(8)},
    },
    "aws-p4d-24xl-topo": {
        "gpu": None, "islands": [list(range(8))], "numa": [0, 0, 0, 0, 1, 1, 1, 1],
        "nics": {"0000:10:1b.0": ([0, 1], "PIX"), "0000:20:1b.0": ([2, 3], "PIX"),
                 "0000:90:1b.0": ([4, 5], "PIX"), "0000:a0:1b.0": ([6, 7], "PIX")},
    },
    "azure-ndv5-topo": {
        "gpu": "h100-sxm", "islands": [list(range(8))], "numa": [0, 0, 0, 0, 1, 1, 1, 1],
        "nics": {f"{0x101 + i:04x}:00:00.0": ([i], "PIX") for i in range(8)},
    },
    "azure-ndv4-topo": {
        "gpu": "a100-sxm4", "islands": [list(range(8))], "numa": [1, 1, 0, 0, 3, 3, 2, 2],
        "nics": {"0101:00:00.0": ([0, 1], "PIX"), "0102:00:00.0": ([0, 1], "PIX"),
                 "0103:00:00.0": ([2, 3], "PIX"), "0104:00:00.0": ([2, 3], "PIX"),
                 "0105:00:00.0": ([4, 5], "PIX"), "0106:00:00.0": ([4, 5], "PIX"),
                 "0107:00:00.0": ([6, 7], "PIX"), "0108:00:00.0": ([6, 7], "PIX")},
    },
    "azure-ndv2-topo": {
        "gpu": "v100-sxm2", "islands": [list(range(8))], "numa": [0, 0, 0, 0, 1, 1, 1, 1],
        "nics": {"0101:00:00.0": ([0, 1, 2, 3], "PHB")},
    },
}


@pytest.fixture
def nccl_dir() -> Path:
    return shared_path("nccl-topo")


def _read(path: Path, gpu: str | None) -> dict[str, Any]:
    return node_capture(read_node_text(path.read_text(), ReadOptions(gpu=gpu)))


@pytest.mark.parametrize("stem", sorted(MACHINES))
def test_nccl_file_matches_its_machine(nccl_dir: Path, stem: str) -> None:
    facts = MACHINES[stem]
    got = _read(nccl_dir / f"{stem}.xml", facts["gpu"])
    assert got["gpu_count"] == 8
    assert got["islands"] == facts["islands"]
    assert [g["numa_node"] for g in got["gpus"]] == facts["numa"]
    nics = {n["name"]: (n["nearest_gpus"], n["level"]) for n in got["nics"]}
    assert nics == facts["nics"]


def test_ndv2_hint_gives_the_hybrid_cube_mesh_cliques(nccl_dir: Path) -> None:
    got = _read(nccl_dir / "azure-ndv2-topo.xml", "v100-sxm2")
    assert [0, 1, 2, 3] in got["cliques"] and [4, 5, 6, 7] in got["cliques"]


def test_ibm_nvswitch_links_are_inferred_through_shared_switches(nccl_dir: Path) -> None:
    node = read_node_text((nccl_dir / "ibm-cloud-gx3d-8xh100-topo.xml").read_text())
    link = node.link(0, 7)
    assert link is not None and link.kind is LinkKind.NVSWITCH and link.lanes == 18
    assert {n.speed_gbit_s for n in node.nics} == {200.0}
    assert node.gpu(0).cpu_affinity == "0-79" and node.gpu(7).cpu_affinity == "80-159"


def test_without_a_hint_missing_nvlink_is_said_not_guessed(nccl_dir: Path) -> None:
    node = read_node_text((nccl_dir / "azure-ndv4-topo.xml").read_text())
    assert node_capture(node)["islands"] == [[i] for i in range(8)]
    assert any("NVLink unknown" in note for note in node.notes)


def test_g5_classless_entries_use_sysfs_then_hints(nccl_dir: Path, tmp_path: Path) -> None:
    shipped = (nccl_dir / "aws-g5.48xl-topo.xml").read_text()
    text = re.sub(r"<!--.*?-->", "", shipped, flags=re.S)  # the same file without its header: no platform
    bare = parse_nccl(text, hints=NcclHints(sysfs_root=tmp_path))
    assert len(bare.gpus) == 0 and "9 PCI devices have no class" in bare.notes[0]
    # On the machine itself, sysfs names the classes (a fake sysfs tree stands in for it).
    gpu_ids = [f"0000:00:{x:02x}.0" for x in range(0x16, 0x1E)]
    for busid, cls in [*((b, "0x030200") for b in gpu_ids), ("0000:00:15.0", "0x020000")]:
        d = tmp_path / "bus/pci/devices" / busid
        d.mkdir(parents=True)
        (d / "class").write_text(cls + "\n")
    node = parse_nccl(text, hints=NcclHints(sysfs_root=tmp_path, gpu="a10g"))
    got = node_capture(node)
    assert got["gpu_count"] == 8 and got["islands"] == [[i] for i in range(8)]
    assert [(n["name"], n["level"]) for n in got["nics"]] == [("0000:00:15.0", "PHB")]
    hinted = parse_nccl(text, hints=NcclHints(sysfs_root=None, pci_classes={"0000:00:15.0": "nic", "*": "gpu"}))
    assert node_capture(hinted)["gpu_count"] == 8 and len(hinted.nics) == 1


def test_g5_static_file_is_read_as_the_platform_it_names(nccl_dir: Path, tmp_path: Path) -> None:
    """aws-ofi-nccl's file says `g5.48xlarge` in its header: 8 A10G, the EFA the ninth bus id; said in a
    note. On the machine itself sysfs still decides, and --pci-class overrides."""
    text = (nccl_dir / "aws-g5.48xl-topo.xml").read_text()
    assert platform_of(text) == "g5.48xlarge"
    node = parse_nccl(text, hints=NcclHints(sysfs_root=tmp_path))
    got = node_capture(node)
    assert got["gpu_count"] == 8 and {g.model for g in node.gpus} == {"a10g"}
    assert [(n["name"], n["level"], n["nearest_gpus"]) for n in got["nics"]] == [("0000:00:15.0", "PHB", [4, 5, 6, 7])]
    assert [g.numa_node for g in node.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert len(node.notes) == 1 and "classified as the g5.48xlarge" in node.notes[0]
    d = tmp_path / "bus/pci/devices/0000:00:16.0"
    d.mkdir(parents=True)
    (d / "class").write_text("0x020000\n")  # this machine says the first id is a NIC
    assert len(parse_nccl(text, hints=NcclHints(sysfs_root=tmp_path)).gpus) == 7
    told = parse_nccl(text, hints=NcclHints(sysfs_root=None, pci_classes={"*": "nic"}))
    assert len(told.gpus) == 0 and len(told.nics) == 9


def _keep_gpus(text: str, count: int) -> str:
    """A real file with all but its first `count` GPUs left out (a smaller VM of the same family)."""
    lines, kept = [], 0
    for line in text.splitlines():
        if 'class="0x03' in line:
            kept += 1
            if kept > count:
                continue
        lines.append(line)
    return "\n".join(lines) + "\n"


def test_nvlink_unknown_is_said_only_where_there_is_a_gpu_pair(nccl_dir: Path, tmp_path: Path) -> None:
    text = (nccl_dir / "azure-ndv4-topo.xml").read_text()
    for count, warned in ((1, False), (2, True)):  # one GPU: no NVLink question to leave open
        path = tmp_path / f"{count}-gpu.xml"
        path.write_text(_keep_gpus(text, count))
        result = run_cli("parse", str(path), "--format", "json")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["gpu_count"] == count
        assert ("NVLink unknown" in result.stderr) is warned, (count, result.stderr)
