"""Cluster specs and machine templates: the simulated machines are real machines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, first_capture, shared_path
from tests.topology.conftest import run_cli
from topology.errors import ParseError
from topology.export import node_capture
from topology.islands import islands
from topology.model import GpuRef
from topology.paths import path
from topology.readers import read_source
from topology.readers.spec import parse_spec
from topology.templates import load_template, node_from_template, template_names

pytestmark = pytest.mark.unit

# template -> the capture it was derived from (where one exists): same GPU fabric and NUMA.
DERIVED = {
    "hgx-h100": "hgx-h100-8gpu-nv18-13nic",
    "dgx1-v100": "dgx1-v100-8gpu-hybrid-cube-mesh-1nic",
    "a30-pairs": "a30-4gpu-nv4-bridge-pairs-1nic",
    "rtx4090-pcie": "rtx4090-8gpu-pcie-2numa",
    "mi300x-xgmi": "amd-mi300-8gpu-xgmi-rocm-smi",
}
REQUIRED = {"hgx-h100", "dgx-a100", "dgx1-v100", "a30-pairs", "rtx4090-pcie", "h100-nvl-pairs", "gb200-nvl72"}


def test_every_required_machine_ships_with_a_source() -> None:
    assert set(template_names()) >= REQUIRED
    for name in template_names():
        t = load_template(name)
        assert t.derived_from and ("capture" in t.derived_from or "vendor" in t.derived_from), name


@pytest.mark.parametrize(("template", "capture"), sorted(DERIVED.items()))
def test_template_reproduces_its_capture(template: str, capture: str) -> None:
    path = shared_path("topo", f"{capture}.expected.json")
    import json

    expected = json.loads(path.read_text())
    got = node_capture(node_from_template(template, "n"))
    assert got["islands"] == expected["islands"]
    assert got["cliques"] == expected["cliques"]
    fabric = {(k["a"], k["b"]): (k["kind"], k["lanes"]) for k in got["links"] if k["kind"] in ("nvlink", "xgmi")}
    want = {(k["a"], k["b"]): (k["kind"], k["lanes"]) for k in expected["links"] if k["kind"] in ("nvlink", "xgmi")}
    assert fabric == want
    if all(g["numa_node"] is not None for g in expected["gpus"]):
        assert [g["numa_node"] for g in got["gpus"]] == [g["numa_node"] for g in expected["gpus"]]


def test_h100_nvl_pairs_and_gb200_rack() -> None:
    assert node_capture(node_from_template("h100-nvl-pairs", "n"))["islands"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    rack = read_source(str(ROOT / "configs/clusters/gb200-nvl72.yaml"))
    assert len(rack.nodes) == 18 and rack.gpu_count == 72
    found = islands(rack)
    assert len(found) == 1 and found[0].size == 72 and len(found[0].nodes) == 18


def test_local_sim_has_the_promised_problems() -> None:
    topo = read_source(str(ROOT / "configs/clusters/local-sim.yaml"))
    assert [n.name for n in topo.nodes] == ["h100-0", "h100-1", "pcie-box", "h100-degraded"]
    by_node = {n.name: sorted(len(i.gpus) for i in islands(topo) if n.name in i.nodes) for n in topo.nodes}
    assert by_node == {"h100-0": [8], "h100-1": [8], "pcie-box": [1] * 8, "h100-degraded": [1, 7]}
    bad = topo.node("h100-degraded").link(3, 4)
    assert bad is not None and not bad.health.healthy


def test_every_cluster_spec_in_configs_loads() -> None:
    specs = sorted((ROOT / "configs/clusters").glob("*.yaml"))
    assert specs
    for spec in specs:
        assert read_source(str(spec)).gpu_count > 0


def test_spec_errors_are_all_reported_with_their_paths() -> None:
    text = """
fabric: {technology: carrier-pigeon}
racks:
  - name: r0
    nodes:
      - {name: a, template: hgx-h100, count: 0}
      - {name: b}
nodes:
  - {name: c, template: hgx-h100, colour: blue}
"""
    with pytest.raises(ParseError) as err:
        parse_spec(text)
    message = str(err.value)
    for where in ("fabric.technology", "racks[0].nodes[0].count", "racks[0].nodes[1]", "nodes[0].colour"):
        assert where in message, message
    assert "\n" not in message


def test_spec_capture_nodes_and_bad_references(tmp_path: Path) -> None:
    capture = first_capture("a30-*.txt")
    (tmp_path / "cap.txt").write_text(capture.read_text())
    spec = "nodes:\n  - {name: x, capture: cap.txt, gpu: a30, count: 2}\n"
    topo = parse_spec(spec, base_dir=tmp_path)
    assert [n.name for n in topo.nodes] == ["x-0", "x-1"] and topo.node("x-0").gpus[0].model == "a30"
    # the part as nvidia-smi names it is the catalogue's a30, and every node says so
    named = parse_spec(spec.replace("gpu: a30", "gpu: NVIDIA A30"), base_dir=tmp_path)
    assert named.node("x-1").gpus[0].model == "a30" and named == topo
    with pytest.raises(ParseError, match="degraded_links names GPU0-GPU9"):
        parse_spec("nodes:\n  - {name: y, template: a30-pairs, degraded_links: [{gpus: [0, 9]}]}\n")
    with pytest.raises(ParseError, match="duplicate node names: z"):
        parse_spec("nodes:\n  - {name: z, template: a30-pairs}\n  - {name: z, template: a30-pairs}\n")


def test_dead_nvlink_in_a_spec_falls_back_to_pcie_and_the_clis_still_size_it(tmp_path: Path) -> None:
    spec = tmp_path / "d.yaml"
    spec.write_text("nodes:\n  - name: a\n    template: hgx-h100\n"
                    "    degraded_links: [{gpus: [1, 2], lanes_active: 0}]\n")
    p = path(read_source(str(spec)), GpuRef("a", 1), GpuRef("a", 2))
    assert p.bandwidth_gb_s > 0 and p.tier == "pcie" and not p.healthy
    assert run_cli("parse", str(spec)).returncode == 0
    size = subprocess.run([sys.executable, "-m", "pools", "size", "--topology", str(spec), "--model", "llama-3.1-70b",
                           "--workload", "azure-conv", "--slo", "interactive"], cwd=ROOT, capture_output=True,
                          text=True, check=False)
    assert size.returncode == 0, size.stderr


def test_grafana_dashboard_queries_metrics_the_router_exports() -> None:
    import json

    from router.metrics import RouterMetrics

    dash = json.loads((ROOT / "configs/grafana-isleserve.json").read_text())
    exported = RouterMetrics().render().decode()
    for panel in dash["panels"]:
        for target in panel["targets"]:
            words = target["expr"].replace("(", " ").replace(")", " ").split()
            for name in [w for w in words if w.startswith("isle_")]:
                base = name.split("[")[0].removesuffix("_bucket").removesuffix("_total")
                assert base in exported, name
