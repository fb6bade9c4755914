"""The live autoscaler's view of the router's load reports: percentiles from histogram
differences, the arrival rate from counters, averages over the look-back, a prefill pool judged
by its decode pools' TTFT, and reports that are not reports."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pools.autoscale.observe import Window, parse_report, quantile
from pools.model import SLOClass

pytestmark = pytest.mark.unit

BOUNDS = [0.01, 0.02, 0.05, 0.1, 1.0]
CLASSES = [SLOClass(name="interactive", priority=0, ttft_ms=500, tpot_ms=50)]


def report(sent: int, running: float, tpot: list[int], ttft: list[int] | None = None, pool: str = "decode"
           ) -> dict[str, Any]:
    return {"buckets": BOUNDS, "pools": {pool: {"running": running, "waiting": 1.0, "sent": sent,
                                               "inflight": {f"{pool}-0": 2}}},
            "tpot": [["interactive", pool, tpot]], "ttft": [["interactive", pool, ttft or [0] * 6]]}


def test_quantile_interpolates_within_the_bucket_as_prometheus_does() -> None:
    assert quantile(BOUNDS, [0, 10, 0, 0, 0, 0], 0.5) == pytest.approx(0.015)
    assert quantile(BOUNDS, [0, 0, 0, 0, 0, 4], 0.99) == 1.0  # in +Inf: the last bound
    assert quantile(BOUNDS, [0] * 6, 0.9) is None
    assert quantile(BOUNDS, [90, 0, 10, 0, 0, 0], 0.95) == pytest.approx(0.035)


def test_rate_load_and_tail_come_from_differences_over_their_periods() -> None:
    w = Window(keep_s=60)
    w.add(parse_report(report(sent=100, running=2, tpot=[50, 0, 0, 0, 0, 0]), at_s=0.0))
    w.add(parse_report(report(sent=120, running=4, tpot=[50, 0, 0, 10, 0, 0]), at_s=10.0))
    w.add(parse_report(report(sent=160, running=8, tpot=[50, 0, 0, 20, 0, 0]), at_s=20.0))
    obs = w.observe(20.0, "decode", "decode", replicas=2, serving=2, classes=CLASSES, percentile=95,
                    look_back_s=10, window_s=20)
    assert obs.request_rate == pytest.approx(4.0)  # (160 - 120) / 10 s
    assert obs.running == 8 and obs.waiting == 1  # the look-back holds one report after its baseline
    # the window's new samples: 20 TPOTs, all in (50 ms, 100 ms]: p95 near the top of that bucket
    assert obs.classes["interactive"].tpot_ms == pytest.approx(97.5)
    assert obs.classes["interactive"].ttft_ms is None
    assert w.inflight() == {"decode-0": 2}


def test_a_prefill_pool_is_judged_by_its_decode_pools_ttft() -> None:
    w = Window(keep_s=60)
    w.add(parse_report(report(sent=0, running=0, tpot=[0] * 6, ttft=[0] * 6), at_s=0.0))
    w.add(parse_report(report(sent=10, running=1, tpot=[0] * 6, ttft=[0, 0, 0, 0, 10, 0]), at_s=5.0))
    obs = w.observe(5.0, "prefill", "prefill", replicas=1, serving=1, classes=CLASSES, percentile=50,
                    look_back_s=5, window_s=5, latency_pools=["decode"])
    assert obs.classes["interactive"].ttft_ms == pytest.approx(550.0)


@pytest.mark.parametrize("doc", ["text", {"pools": {"d": {"sent": "many"}}},
                                 {"buckets": [1.0], "tpot": [["c", "p", [1, 2, 3]]]}])
def test_what_is_not_a_report_is_refused(doc: Any) -> None:
    with pytest.raises(ValueError):
        parse_report(doc, 0.0)


def _with(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """A valid report with one value replaced (a path of keys and indices)."""
    doc = report(sent=10, running=1.0, tpot=[1, 0, 0, 0, 0, 0])
    target: Any = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


@pytest.mark.parametrize(("path", "value"), [
    (("pools", "decode", "running"), float("nan")),
    (("pools", "decode", "running"), float("inf")),
    (("pools", "decode", "waiting"), -1.0),
    (("pools", "decode", "waiting"), 1e12),
    (("pools", "decode", "running"), True),
    (("pools", "decode", "sent"), 1.5),
    (("pools", "decode", "sent"), -3),
    (("pools", "decode", "inflight"), {f"r{i}": 1 for i in range(5000)}),
    (("pools", "decode", "inflight", "decode-0"), "2"),
    (("buckets",), [0.02, 0.01, 0.05, 0.1, 1.0]),
    (("buckets",), [0.01, float("nan"), 0.05, 0.1, 1.0]),
    (("tpot", 0, 2), [1, 0, 0, 0, 0, float("inf")]),
    (("tpot", 0, 2), [1, 0, 0, 0, 0]),
    (("ttft", 0), ["interactive", "decode"]),
    (("ttft", 0, 0), "x" * 300),
    (("pools",), {f"p{i}": {} for i in range(300)}),
    (("forged",), 1),
])
def test_a_report_with_any_figure_out_of_bounds_is_refused_whole(path: tuple[Any, ...], value: Any) -> None:
    """NaN, infinities, negative or absurd gauges, fractional counts, oversized maps and lists,
    unknown keys: each refuses the report (ValueError), so it never reaches the window."""
    assert parse_report(report(sent=10, running=1.0, tpot=[1, 0, 0, 0, 0, 0]), at_s=0.0).pools["decode"].sent == 10
    with pytest.raises(ValueError):
        parse_report(_with(path, value), at_s=0.0)


def test_reports_beyond_the_rate_are_dropped_and_counted() -> None:
    from control.autoscaling import REPORT_BURST, REPORTS_PER_S, Autoscaling
    from control.spec import AutoscaleSpec

    now = [0.0]
    scaler = Autoscaling(AutoscaleSpec(), clock=lambda: now[0])
    good = report(sent=10, running=1.0, tpot=[1, 0, 0, 0, 0, 0])
    taken = 0
    for _ in range(50):  # a flood at one instant: the burst is taken, the rest refused
        try:
            scaler.observe(good)
            taken += 1
        except ValueError as err:
            assert "faster than" in str(err)
    assert taken == int(REPORT_BURST) and scaler.refused == 50 - taken
    now[0] += 1.0  # a second later: REPORTS_PER_S more
    for _ in range(int(REPORTS_PER_S)):
        scaler.observe(good)
    with pytest.raises(ValueError):
        scaler.observe(good)
    assert scaler.reports == taken + int(REPORTS_PER_S)


def test_the_load_report_is_a_typed_value_with_a_checked_json_form() -> None:
    import jsonschema  # type: ignore[import-untyped]

    from pools.autoscale.report import SCHEMA, LoadReport, PoolLoad

    report = LoadReport(buckets=(0.1, 0.5, 1.0), pools={
        "decode": PoolLoad(running=3.0, waiting=1.5, sent=42, inflight={"decode-0": 2, "decode-1": 1}),
        "prefill": PoolLoad(sent=40)}, ttft={("interactive", "decode"): (5, 3, 1, 0)},
        tpot={("interactive", "decode"): (8, 1, 0, 0), ("batch", "decode"): (0, 0, 0, 2)})
    doc = report.to_json()
    jsonschema.validate(doc, SCHEMA)
    assert json.loads(json.dumps(doc)) == doc  # plain JSON: what crosses from the router to the controller
    assert LoadReport.from_json(doc) == report
    for broken in ({**doc, "extra": 1}, {**doc, "buckets": [0.5, 0.1, 1.0]},
                   {**doc, "ttft": [["interactive", "decode", [1, 2]]]},
                   {**doc, "pools": {"decode": {"running": float("nan")}}}):
        with pytest.raises(ValueError):
            LoadReport.from_json(broken)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**doc, "extra": 1}, SCHEMA)
