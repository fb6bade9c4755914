"""`topology diff` (the post-maintenance drift check), `show`, `survey` and the `isle` dispatcher."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, first_capture
from tests.topology.conftest import run_cli
from topology.diff import diff
from topology.model import Topology
from topology.readers import read_node_text, read_source
from topology.readers.spec import parse_spec

pytestmark = pytest.mark.unit

HEALTHY = "nodes:\n  - {name: n, template: hgx-h100}\n  - {name: m, template: rtx4090-pcie}\n"


def test_no_change_is_exit_0(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(HEALTHY)
    result = run_cli("diff", str(tmp_path / "a.yaml"), str(tmp_path / "a.yaml"))
    assert result.returncode == 0 and result.stdout == "no changes\n"


def test_degraded_gpu_missing_nic_and_lost_node_are_worse(tmp_path: Path) -> None:
    old = parse_spec(HEALTHY)
    new = parse_spec("nodes:\n  - name: n\n    template: hgx-h100\n"
                     "    degraded_gpus: [{gpu: 5, lanes_active: 6}]\n")
    changes = diff(old, new)
    text = [f"{c.node} {c.subject}: {c.what}" for c in changes if c.worse]
    assert "m node: missing" in text
    assert any(t.startswith("n GPU4-GPU5: unhealthy: NVLink lanes 6/18") for t in text)
    assert any("split into {0,1,2,3,4,6,7} {5}" in t for t in text)


def test_cli_diff_reports_worse_with_exit_1(tmp_path: Path) -> None:
    (tmp_path / "old.yaml").write_text(HEALTHY)
    (tmp_path / "new.yaml").write_text(HEALTHY.replace("rtx4090-pcie", "a30-pairs"))
    result = run_cli("diff", str(tmp_path / "old.yaml"), str(tmp_path / "new.yaml"), "--format", "json")
    assert result.returncode == 1
    verdicts = json.loads(result.stdout)
    assert {"node": "m", "subject": "GPU4", "what": "missing", "verdict": "worse"} in verdicts
    assert any(v["verdict"] == "better" and "joined" in v["what"] for v in verdicts)


def test_capture_against_its_own_json_is_unchanged(tmp_path: Path) -> None:
    capture = first_capture("dgx1-*.txt")
    saved = tmp_path / "baseline.json"
    saved.write_text(run_cli("parse", str(capture), "--format", "json").stdout)
    assert diff(read_source(str(saved)), read_source(str(capture))) == []
    trained_down = capture.read_text().replace("NV2", "NV1")
    (tmp_path / "after.txt").write_text(trained_down)
    result = run_cli("diff", str(saved), str(tmp_path / "after.txt"))
    assert result.returncode == 1 and "nvlink NV2 -> nvlink NV1" in result.stdout


TWO_NICS = (ROOT / "tests/data/two-nics-2numa.txt").read_text()


def test_nic_moving_to_another_gpu_is_reported() -> None:
    moved = TWO_NICS.replace("GPU0\t X \tNV4\tSYS\tSYS\tPIX", "GPU0\t X \tNV4\tSYS\tSYS\tPXB").replace(
        "GPU1\tNV4\t X \tSYS\tSYS\tPXB", "GPU1\tNV4\t X \tSYS\tSYS\tPIX").replace(
        "NIC0\tPIX\tPXB", "NIC0\tPXB\tPIX")
    changes = diff(Topology(nodes=(read_node_text(TWO_NICS),)), Topology(nodes=(read_node_text(moved),)))
    assert [c.what for c in changes if c.worse] == ["nearest GPUs [0] -> [1] (PIX)"]


def test_one_pair_training_down_is_one_change() -> None:
    text = first_capture("hgx-h100*.txt").read_text()
    lines = text.splitlines()
    lines[1] = lines[1].replace("NV18", "NV16", 1)  # GPU0-GPU1
    lines[2] = lines[2].replace("NV18", "NV16", 1)  # GPU1-GPU0
    changes = diff(Topology(nodes=(read_node_text(text),)), Topology(nodes=(read_node_text("\n".join(lines)),)))
    assert [(c.subject, c.what) for c in changes if c.worse] == [("GPU0-GPU1", "nvlink NV18 -> nvlink NV16")]


@pytest.mark.parametrize("suffix", [".svg", ".png"])
def test_show_draws_islands_nics_and_unhealthy_links(tmp_path: Path, suffix: str) -> None:
    out = tmp_path / f"local{suffix}"
    result = run_cli("show", str(ROOT / "configs/clusters/local-sim.yaml"), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert out.stat().st_size > 10_000
    if suffix == ".svg":
        svg = out.read_text()
        for text in ("h100-degraded", "NVSwitch NV18", "mlx5_ib0", "NUMA 1", "unhealthy link"):
            assert text in svg, text
        assert "#cf222e" in svg  # the unhealthy colour is used


def test_show_with_plan_overlay_and_bad_suffix(tmp_path: Path) -> None:
    plan = {"placements": [{"replica_id": "decode-0", "node": "node0", "role": "decode", "gpus": [0, 1, 2, 3]}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    out = tmp_path / "dgx1.svg"
    assert run_cli("show", "dgx1-v100", "--out", str(out), "--plan", str(tmp_path / "plan.json")).returncode == 0
    assert "decode-0" in out.read_text()
    bad = run_cli("show", "dgx1-v100", "--out", str(tmp_path / "x.jpg"))
    assert bad.returncode == 2 and ".svg or .png" in bad.stderr


def test_survey_and_isle_dispatcher(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "isle.py", "topology", "survey", "hgx-h100", "a30-pairs", "--out-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "a30-pairs: 4 GPUs on 1 node(s)" in result.stdout and "islands {0-1} {2-3}" in result.stdout
    assert (tmp_path / "a30-pairs.svg").exists()
    unknown = subprocess.run([sys.executable, "isle.py", "nope"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert unknown.returncode == 2 and "unknown command" in unknown.stderr


@pytest.mark.parametrize(("content", "message"), [
    (None, "cannot read plan"), ("[1, 2]", "placements"), ('{"placements": [{"node": "n", "gpus": [[0]]}]}',
                                                           "placements"), ("{", "not JSON")])
def test_show_plan_errors_are_one_line(tmp_path: Path, content: str | None, message: str) -> None:
    plan = tmp_path / "plan.json"
    if content is not None:
        plan.write_text(content)
    result = run_cli("show", "a30-pairs", "--out", str(tmp_path / "x.svg"), "--plan", str(plan))
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
