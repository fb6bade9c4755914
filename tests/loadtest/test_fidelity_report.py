"""`python -m pools fidelity`: every shipped published point is either priced by the cost model
in its own unit or listed with the reason it is not; nothing is dropped, every point cites a
source. (How close the model is, is the report's answer, not this test's: README.)"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from loadtest.fidelity import report as fidelity
from pools.__main__ import main

pytestmark = pytest.mark.unit


def test_every_point_is_priced_or_says_why() -> None:
    points = fidelity.points()
    rows = fidelity.rows()
    assert len(rows) == len(points) >= 30
    assert len({r.id for r in rows}) == len(rows)
    for r in rows:
        assert r.source and r.published > 0
        assert (r.predicted is not None and r.predicted >= 0) != bool(r.skipped), r
    kinds = {r.kind for r in rows if r.predicted is not None}
    assert {"prefill", "decode", "collective", "kv"} <= kinds


def test_bus_bandwidth_is_read_as_nccl_tests_defines_it() -> None:
    point = {"kind": "collective", "op": "all_reduce", "bytes": 1 << 30, "gpus": 8, "link": "nvswitch",
             "unit": "GB/s-busbw", "value": 1.0}
    busbw, why = fidelity.predict(point)
    algbw, _ = fidelity.predict({**point, "unit": "GB/s-algbw"})
    assert not why and busbw is not None and algbw is not None
    assert busbw == pytest.approx(algbw * 2 * 7 / 8)


def test_the_report_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fidelity", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    s = report["summary"]
    assert s["points"] == len(report["rows"]) and s["priced"] + s["skipped"] == s["points"]
    assert 0 <= s["within_25pct"] <= 1 and len(s["worst"]) == 3
    assert main(["fidelity"]) == 0
    text = capsys.readouterr().out
    assert "within 25%" in text and "worst:" in text


def test_points_the_model_has_not_seen_are_scored_without_fitting(tmp_path: Any,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """`pools fidelity --score FILE`: a user's (or an independent check's) own published points,
    a bare list or the published files' form, priced by the shipped model and summed up by kind
    and source; the fit does not move; a malformed file is one line and exit 2."""
    shipped = {p["id"]: p for p in fidelity.points()}
    mine = [{**shipped[i], "id": f"mine-{n}", "source_id": "MINE"} for n, i in enumerate(list(shipped)[:3])]
    mine.append({"id": "mine-unknown-gpu", "kind": "decode", "gpu": "h900", "model": "llama-3.1-8b", "tp": 1,
                 "batch": 1, "context": 128, "value": 10.0, "unit": "ms", "source_id": "MINE"})
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(mine))
    (tmp_path / "form.yaml").write_text(yaml.safe_dump({"sources": {}, "points": mine[:1]}))
    before = [r.predicted for r in fidelity.rows()]
    assert main(["fidelity", "--score", str(tmp_path / "mine.yaml"), str(tmp_path / "form.yaml"),
                 "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["id"]: r for r in out["rows"]}
    assert len(out["rows"]) == 5 and rows["mine-unknown-gpu"]["skipped"] == "GPU h900 is not in the catalogue"
    original = {r.id: r for r in fidelity.rows()}
    for n, i in enumerate(list(shipped)[:3]):  # priced exactly as the shipped point it copies
        assert rows[f"mine-{n}"]["predicted"] == original[i].predicted
    assert out["report"]["by_source"]["MINE"]["priced"] == sum(r["ratio"] is not None for r in out["rows"])
    assert [r.predicted for r in fidelity.rows()] == before
    (tmp_path / "bad.yaml").write_text("- {id: x, kind: decode, unit: ms}\n")
    assert main(["fidelity", "--score", str(tmp_path / "bad.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "needs value" in err and len(err.splitlines()) == 1


def test_a_whole_run_is_priced_only_for_the_engine_whose_loop_the_model_follows() -> None:
    """TensorRT-LLM's trtllm-bench runs admit whole prompts beside the decodes, the closed loop
    `physics.moeserving` prices; the same run's figure from an engine that chunks its prompts
    (vLLM) is not priced by it, and says why."""
    shipped = {p["id"]: p for p in fidelity.points()}["trtllm-dsr1-h200-maxtput"]
    assert fidelity.rows([shipped])[0].predicted is not None
    other = fidelity.rows([{**shipped, "id": "vllm-run", "framework": "vLLM 0.11.1"}])[0]
    assert other.predicted is None and "TensorRT-LLM" in other.skipped
