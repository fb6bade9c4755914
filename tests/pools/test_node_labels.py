"""`python -m pools node-labels`: the topology as Ray labels and resources."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pools.nodelabels import node_labels, node_resources, ray_start_args
from tests.conftest import ROOT
from tests.support import fake_nvml
from topology import Topology, read_source
from topology.readers.nvml import discover

pytestmark = pytest.mark.unit

# Ray label keys: an optional DNS-style prefix and a name; values: alphanumerics, '-', '_', '.'
KEY = re.compile(r"^isle\.io/[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
VALUE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")


def test_nvml_discovered_node_labels_and_per_gpu_resources(tmp_path: Path) -> None:
    nvml = fake_nvml.hgx_h100(degraded_gpu=3, active_ports=4)
    node = discover(node_name="gpu-7", nvml=nvml, sysfs_root=fake_nvml.write_sysfs(tmp_path, nvml, {}))
    topo = Topology(nodes=(node,))
    labels = node_labels(topo, node)
    assert all(KEY.match(k) and VALUE.match(v) for k, v in labels.items()), labels
    assert labels["isle.io/islands"] == "7_1" and labels["isle.io/gpus"] == "8"
    # the catalogue's part, as NVML's name 'NVIDIA H100 80GB HBM3' reads (the router and placement
    # look parts up by it), not NVML's string
    assert labels["isle.io/gpu-model"] == "h100-sxm"
    resources = node_resources(topo, node)
    assert resources["isle_island_gpu_7_0"] == 7.0 and resources["isle_island_gpu_7_1"] == 1.0
    assert sum(1 for k in resources if k.startswith("isle_gpu_gpu_7_")) == 8
    assert ray_start_args(topo, node).startswith('--num-gpus=8 --labels="isle.io/node=gpu-7,')


def test_nvl72_trays_share_one_nvlink_domain_label() -> None:
    rack = read_source(str(ROOT / "configs/clusters/gb200-nvl72.yaml"))
    domains = {node_labels(rack, n)["isle.io/nvlink-domain"] for n in rack.nodes}
    assert len(domains) == 1 and domains != {"tray-00"}


def test_cli_for_a_simulated_node_and_bad_choices() -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pools", "node-labels", *args], cwd=ROOT, capture_output=True,
                              text=True, check=False)

    ok = run("--source", "configs/clusters/local-sim.yaml", "--node", "pcie-box", "--format", "json")
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert doc["labels"]["isle.io/islands"] == "1_1_1_1_1_1_1_1" and doc["labels"]["isle.io/rack"] == "rack1"
    several = run("--source", "configs/clusters/local-sim.yaml")
    assert several.returncode == 2 and "pick one with --node" in several.stderr
    no_driver = run()
    assert no_driver.returncode == 2 and "NVML" in no_driver.stderr
