"""`python -m pools fidelity`: every shipped published point is either priced by the cost model
in its own unit or listed with the reason it is not; nothing is dropped, every point cites a
source. (How close the model is, is the report's answer, not this test's: README.)"""

from __future__ import annotations

import json

import pytest

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
