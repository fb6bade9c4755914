"""`python -m pools plan|size|bench` and `isle plan` as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pools import bench
from pools.model import SLOClass
from pools.sizing import parse_workload, size
from tests.conftest import ROOT, TOPO_DIR, shared_path
from topology import read_source

pytestmark = pytest.mark.unit

PLACEMENT_KEYS = {"replica_id", "pool", "role", "node", "gpus", "island", "tier"}


def pools_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pools", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=False)


@pytest.mark.parametrize("source", ["configs/clusters/local-sim.yaml", "dgx1-v100",
                                    str(TOPO_DIR / "a30-4gpu-nv4-bridge-pairs-1nic.txt")])
def test_plan_json_schema(source: str) -> None:
    if source.endswith(".txt"):
        shared_path("topo", Path(source).name)
    result = pools_cli("plan", "--topology", source, "--pools", "configs/pools/mixed-tp.yaml",
                       "--policy", "ray-pack", "--format", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert {"policy", "topology_fingerprint", "placements", "unplaced", "summary"} <= set(doc)
    assert doc["policy"] == "ray-pack" and doc["topology_fingerprint"] == read_source(source).fingerprint()
    for p in doc["placements"]:
        assert set(p) >= PLACEMENT_KEYS and all(isinstance(g, int) for g in p["gpus"])
        assert p["role"] in ("prefill", "decode", "mixed") and p["tier"] in ("local", "nvlink", "pcie", "numa",
                                                                             "rdma", "tcp", "rack")
    for u in doc["unplaced"]:
        assert set(u) == {"pool", "count", "reason"}
    assert set(doc["summary"]) == {"gpus_used", "cross_island_tp_groups", "cross_domain_ep_groups", "pp_boundaries",
                                   "score"}


def test_plan_table_and_isle_alias() -> None:
    result = subprocess.run([sys.executable, "isle.py", "plan", "--topology", "dgx1-v100", "--pools",
                             "configs/pools/mixed-tp.yaml"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].split() == ["replica", "pool", "role", "node", "gpus", "island", "tier"]
    assert "0 cross-island TP groups" in result.stdout


BAD = [
    ("not-a-list", "pools: 3\n", "pools"),
    ("bad-tp", "pools:\n  - {name: a, role: mixed, tp: 0, replicas: 1}\n", "pools[0].tp"),
    ("bad-role", "pools:\n  - {name: a, role: chef, tp: 1, replicas: 1}\n", "pools[0].role"),
    ("unknown-model", "pools:\n  - {name: a, role: mixed, tp: 1, replicas: 1, model: gpt-9}\n", "unknown model"),
    ("unknown-class", "pools:\n  - {name: a, role: mixed, tp: 1, replicas: 1, slo_classes: [gold]}\n", "gold"),
    ("duplicate", "pools:\n  - {name: a, role: mixed, tp: 1, replicas: 1}\n  - {name: a, role: mixed, tp: 1, "
                  "replicas: 1}\n", "duplicate pool names"),
    ("extra-key", "pools:\n  - {name: a, role: mixed, tp: 1, replicas: 1, colour: red}\n", "colour"),
    ("yaml", "pools: [\n", "not valid YAML"),
]


@pytest.mark.parametrize(("name", "text", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_pools_file_exits_2(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = tmp_path / "pools.yaml"
    path.write_text(text)
    result = pools_cli("plan", "--topology", "dgx1-v100", "--pools", str(path))
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_bad_topology_and_policy_exit_2(tmp_path: Path) -> None:
    (tmp_path / "t.txt").write_text("garbage\n")
    assert pools_cli("plan", "--topology", str(tmp_path / "t.txt"), "--pools", "configs/pools/mixed-tp.yaml"
                     ).returncode == 2
    result = pools_cli("plan", "--topology", "dgx1-v100", "--pools", "configs/pools/mixed-tp.yaml",
                       "--policy", "greedy")
    assert result.returncode == 2 and "invalid choice" in result.stderr


def test_replan_after_a_node_fails(tmp_path: Path) -> None:
    (tmp_path / "after.yaml").write_text(
        (ROOT / "configs/clusters/local-sim.yaml").read_text().replace("count: 2", "count: 1"))
    result = pools_cli("plan", "--topology", "configs/clusters/local-sim.yaml", "--pools", "configs/pools/pd-70b.yaml",
                       "--replan-after", str(tmp_path / "after.yaml"), "--format", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert all(p["node"] != "h100-1" for p in doc["placements"])
    assert any("re-plan" in r for r in doc["reasons"])


def test_sizing_proposes_a_split_and_explains() -> None:
    topology = read_source("configs/clusters/low-affinity-pd.yaml")
    # TPOT 30 ms binds the decode batch (at 50 ms a 70B TP4 decode already runs its 256-sequence cap)
    interactive = SLOClass(name="interactive", priority=0, ttft_ms=300, tpot_ms=30)
    proposal = size(topology, "llama-3.1-70b", "azure-conv", [interactive])
    assert proposal.prefill.tp >= 4 and proposal.decode.tp >= 4  # 70B does not fit at tp=2 on 80 GB
    assert proposal.gpus <= 32 and proposal.prefill_replicas >= 1 and proposal.decode_replicas >= 1
    assert proposal.goodput_per_gpu > 0 and len(proposal.explanation) == 3
    loose = size(topology, "llama-3.1-70b", "azure-conv", [SLOClass(name="b", priority=2, ttft_ms=5000, tpot_ms=200)])
    assert loose.goodput_per_gpu > proposal.goodput_per_gpu  # looser SLOs serve more per GPU
    assert parse_workload("100:10") == (100, 10)
    with pytest.raises(ValueError, match="PROMPT:OUTPUT"):
        parse_workload("lots")
    result = pools_cli("size", "--topology", "hgx-h100", "--model", "llama-3.1-8b", "--workload", "azure-code",
                       "--slo", "interactive", "--format", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["prefill"]["replicas"] * doc["prefill"]["tp"] + doc["decode"]["replicas"] * doc["decode"]["tp"] <= 8


def test_bench_runs_small() -> None:
    figures = bench.run(racks=2)  # the full 32-rack run is `python -m pools bench` (README)
    assert figures["gpus"] == 2 * 32 * 8 and isinstance(figures["placed"], int) and figures["placed"] > 0
    assert isinstance(figures["plan_s"], float) and isinstance(figures["replan_s"], float)


def test_replicas_auto_is_sized_then_placed(tmp_path: Path) -> None:
    result = pools_cli("plan", "--topology", "configs/clusters/local-sim.yaml", "--pools", "configs/pools/pd-auto.yaml",
                       "--format", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    roles = [p["role"] for p in doc["placements"]]
    assert roles.count("prefill") >= 1 and roles.count("decode") >= 1 and "auto: prefill x" in result.stderr
    (tmp_path / "bad.yaml").write_text(
        "pools:\n  - {name: m, role: mixed, tp: 1, replicas: auto, model: llama-3.1-8b}\n")
    bad = pools_cli("plan", "--topology", "hgx-h100", "--pools", str(tmp_path / "bad.yaml"))
    assert bad.returncode == 2 and "give mixed pools a count" in bad.stderr
