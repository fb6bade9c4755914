"""Summaries as `vllm bench serve` reports them: mean, median, p90 and p99 of TTFT, TPOT, ITL and
E2E in milliseconds; request and output-token throughput; goodput (requests per second that met
their class's TTFT and TPOT targets) and SLO attainment per class; the same latencies per tier."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from loadtest.model import RequestResult
from pools.model import SLOClass

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def stats_ms(values: Sequence[float]) -> dict[str, float]:
    """mean, median, p90, p99 of seconds, in ms (NaN when there are none)."""
    ms = [v * 1000 for v in values]
    out = {"mean": sum(ms) / len(ms) if ms else math.nan, "median": percentile(ms, 50)}
    out.update({f"p{q}": percentile(ms, q) for q in PERCENTILES if q != 50})
    return {k: round(v, 3) if not math.isnan(v) else v for k, v in out.items()}


def met_slo(r: RequestResult, cls: SLOClass | None) -> bool:
    if not r.ok or r.ttft_s is None:
        return False
    if cls is None:
        return True
    if r.ttft_s * 1000 > cls.ttft_ms:
        return False
    return r.tpot_s is None or r.tpot_s * 1000 <= cls.tpot_ms


def latencies(results: Iterable[RequestResult]) -> dict[str, dict[str, float]]:
    ok = [r for r in results if r.ok]
    return {"ttft_ms": stats_ms([r.ttft_s for r in ok if r.ttft_s is not None]),
            "tpot_ms": stats_ms([r.tpot_s for r in ok if r.tpot_s is not None]),
            "itl_ms": stats_ms([x for r in ok for x in r.itls_s]),
            "e2e_ms": stats_ms([r.e2e_s for r in ok if r.e2e_s is not None])}


def summarize(results: Sequence[RequestResult], classes: Mapping[str, SLOClass], duration_s: float
              ) -> dict[str, Any]:
    """One run's figures. `duration_s`: the wall (or simulated) time the run took."""
    duration_s = max(duration_s, 1e-9)
    ok = [r for r in results if r.ok]
    outcomes: dict[str, int] = {}
    for r in results:
        outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
    good = [r for r in results if met_slo(r, classes.get(r.slo_class))]
    per_class: dict[str, Any] = {}
    for name in sorted({r.slo_class for r in results}):
        mine = [r for r in results if r.slo_class == name]
        met = sum(1 for r in mine if met_slo(r, classes.get(name)))
        per_class[name] = {"requests": len(mine), "completed": sum(1 for r in mine if r.ok),
                           "slo_attainment": round(met / len(mine), 4) if mine else math.nan,
                           "goodput_rps": round(met / duration_s, 4), **latencies(mine)}
    per_tier = {tier: {"requests": sum(1 for r in ok if r.tier == tier), **latencies(r for r in ok if r.tier == tier)}
                for tier in sorted({r.tier for r in ok})}
    return {
        "requests": len(results), "completed": len(ok), "outcomes": outcomes, "duration_s": round(duration_s, 3),
        "request_throughput_rps": round(len(ok) / duration_s, 4),
        "output_throughput_tok_s": round(sum(r.output_tokens for r in ok) / duration_s, 2),
        "goodput_rps": round(len(good) / duration_s, 4),
        "good_output_tok_s": round(sum(r.output_tokens for r in good) / duration_s, 2),
        "slo_attainment": round(len(good) / len(results), 4) if results else math.nan,
        **latencies(results), "per_class": per_class, "per_tier": per_tier,
    }


def format_summary(summary: Mapping[str, Any]) -> str:
    """The console table, in `vllm bench serve`'s order."""
    lines = [f"{'Successful requests:':<40}{summary['completed']:>12}",
             f"{'Benchmark duration (s):':<40}{summary['duration_s']:>12.2f}",
             f"{'Request throughput (req/s):':<40}{summary['request_throughput_rps']:>12.2f}",
             f"{'Output token throughput (tok/s):':<40}{summary['output_throughput_tok_s']:>12.2f}",
             f"{'Goodput (req/s, every class SLO):':<40}{summary['goodput_rps']:>12.2f}"]
    for key, title in (("ttft_ms", "Time to First Token"), ("tpot_ms", "Time per Output Token (excl. 1st token)"),
                       ("itl_ms", "Inter-token Latency"), ("e2e_ms", "End-to-end Latency")):
        lines.append(f"{'-' * 15}{title:^30}{'-' * 15}")
        for stat, value in summary[key].items():
            label = "Median" if stat == "median" else stat.capitalize() if stat == "mean" else stat.upper()
            lines.append(f"{f'{label} {key[:-3].upper()} (ms):':<40}{value:>12.2f}")
    for name, c in summary["per_class"].items():
        lines.append(f"class {name}: {c['completed']}/{c['requests']} completed, SLO attainment "
                     f"{c['slo_attainment']:.1%}, goodput {c['goodput_rps']:.2f} req/s")
    if len(summary["outcomes"]) > 1 or "ok" not in summary["outcomes"]:
        lines.append("outcomes: " + ", ".join(f"{k}={v}" for k, v in sorted(summary["outcomes"].items())))
    return "\n".join(lines)
