"""The router's latency buckets are fine enough that Prometheus' `histogram_quantile` (linear
interpolation inside the bucket that holds the rank) is within 10% of the true p50/p99 the
clients measured, across the range the SLO classes span (ms-scale ITL to 30 s batch TTFT),
even in the worst case: every observation the same value."""

from __future__ import annotations

import math
import random

import pytest
from prometheus_client.parser import text_string_to_metric_families

from router.metrics import RouterMetrics
from tests.support.quantile import histogram_quantile

pytestmark = pytest.mark.unit


def scraped(metrics: RouterMetrics) -> list[tuple[float, float]]:
    for family in text_string_to_metric_families(metrics.render().decode()):
        if family.name == "isle_router_ttft_seconds":
            return [(float(s.labels["le"]), s.value) for s in family.samples if s.name.endswith("_bucket")]
    raise AssertionError("no ttft family")


def exact(q: float, values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


@pytest.mark.parametrize("median_s", [0.004, 0.05, 0.3, 2.03, 9.0, 30.0])
@pytest.mark.parametrize("spread", [0.0, 0.1, 0.5])
def test_histogram_quantile_is_within_10_percent_of_the_measured_one(median_s: float, spread: float) -> None:
    rng = random.Random(int(median_s * 1000) + int(spread * 10))
    values = [median_s * math.exp(rng.gauss(0, spread)) for _ in range(2000)]
    metrics = RouterMetrics()
    series = metrics.child(metrics.ttft, "interactive", "pool", "nvlink")
    for v in values:
        series.observe(v)
    buckets = scraped(metrics)
    for q in (0.5, 0.9, 0.99):
        got, want = histogram_quantile(q, buckets), exact(q, values)
        assert abs(got - want) / want <= 0.10, (q, got, want)


def test_metrics_show_only_the_buckets_that_hold_something_and_quantiles_do_not_change() -> None:
    """/metrics leaves out the buckets no series of a family has anything in (all but a few of
    the 137 when latencies fill a few octaves). Every series of the family shows the same
    bounds, so a sum over series (`sum by (le, tier)`) adds bucket for bucket, and a quantile of
    any sum is the one the whole layout gives."""
    rng = random.Random(7)
    metrics = RouterMetrics()
    fast = [0.02 * math.exp(rng.gauss(0, 0.2)) for _ in range(500)]
    slow = [1.5 * math.exp(rng.gauss(0, 0.3)) for _ in range(500)]
    for v in fast:
        metrics.child(metrics.ttft, "interactive", "decode", "nvlink").observe(v)
    for v in slow:
        metrics.child(metrics.ttft, "batch", "mixed", "cross-node").observe(v)
    per_series: dict[str, list[tuple[float, float]]] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        if family.name == "isle_router_ttft_seconds":
            for s in family.samples:
                if s.name.endswith("_bucket"):
                    per_series.setdefault(s.labels["tier"], []).append((float(s.labels["le"]), s.value))
    bounds = {tier: [le for le, _ in rows] for tier, rows in per_series.items()}
    assert bounds["nvlink"] == bounds["cross-node"]  # the same bounds in every series
    assert len(bounds["nvlink"]) < 60  # of 138
    summed = [(le, a + b) for (le, a), (_, b) in zip(per_series["nvlink"], per_series["cross-node"], strict=True)]
    for q in (0.5, 0.9, 0.99):
        want = exact(q, fast + slow)
        assert abs(histogram_quantile(q, summed) - want) / want <= 0.10, q
        for tier, values in (("nvlink", fast), ("cross-node", slow)):
            got = histogram_quantile(q, per_series[tier])
            assert abs(got - exact(q, values)) / exact(q, values) <= 0.10, (tier, q)
