"""What the live autoscaler sees: the router's load reports, kept over a sliding window and turned
into one `PoolObservation` per pool (pure: reports and times in, observations out).

A report (`pools.autoscale.report.LoadReport`, its JSON form checked on the way in) comes every
second from the one router the deployment runs, whose workers' figures it merges; its figures
are cumulative.

`running`/`waiting` are the engines' gauges as last scraped (averaged here over `look_back_s`,
as Ray Serve averages over `look_back_period_s`); `sent` counts requests (and PD legs) the router
sent to the pool's replicas (the rate is its difference over `look_back_s`); the histograms are
the router's TTFT and TPOT by class and pool (the percentile comes from their difference over
`window_s`, interpolated within a bucket as Prometheus' `histogram_quantile` does).
A prefill pool's requests carry their decode pool's label: a prefill pool is judged by the TTFT
of every pool of its model (`latency_pools`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pools.autoscale.policy import ClassLatency, PoolObservation, Role
from pools.autoscale.report import Counts, LoadReport, PoolLoad
from pools.model import SLOClass


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    """A load report as the window keeps it: when it came, and what it said."""

    at_s: float
    bounds: tuple[float, ...] = ()
    pools: Mapping[str, PoolLoad] = field(default_factory=dict)
    ttft: Mapping[tuple[str, str], Counts] = field(default_factory=dict)
    tpot: Mapping[tuple[str, str], Counts] = field(default_factory=dict)

    @staticmethod
    def of(load: LoadReport, at_s: float) -> Report:
        return Report(at_s=at_s, bounds=load.buckets, pools=load.pools, ttft=load.ttft, tpot=load.tpot)


def parse_report(doc: Any, at_s: float) -> Report:
    """A router's report in its JSON form (`LoadReport.from_json`: ValueError when it is not one),
    stamped with when it came."""
    return Report.of(LoadReport.from_json(doc), at_s)


def quantile(bounds: Sequence[float], counts: Sequence[int], q: float) -> float | None:
    """The q-quantile (0..1) of a histogram (`counts` per bucket, +Inf last), linear within its
    bucket as `histogram_quantile` is; None when it is empty. In the +Inf bucket: the last bound."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(counts):
        if n > 0 and seen + n >= rank:
            if i >= len(bounds):
                return bounds[-1] if bounds else None
            low = bounds[i - 1] if i > 0 else 0.0
            return low + (bounds[i] - low) * (rank - seen) / n
        seen += n
    return bounds[-1] if bounds else None


class Window:
    """The reports of the last `keep_s` seconds."""

    def __init__(self, keep_s: float) -> None:
        self.keep_s = keep_s
        self.reports: deque[Report] = deque()

    def add(self, report: Report) -> None:
        if self.reports and report.at_s < self.reports[-1].at_s:
            return  # out of order: the newer one stands
        self.reports.append(report)
        while len(self.reports) > 2 and self.reports[1].at_s <= report.at_s - self.keep_s:
            self.reports.popleft()

    def since(self, now_s: float, span_s: float) -> list[Report]:
        """The reports of the last `span_s`, and the one just before it (the baseline)."""
        out = [r for r in self.reports if r.at_s > now_s - span_s]
        earlier = [r for r in self.reports if r.at_s <= now_s - span_s]
        return ([earlier[-1]] if earlier else []) + out

    def observe(self, now_s: float, pool: str, role: Role, replicas: int, serving: int,
                classes: Sequence[SLOClass], percentile: float, look_back_s: float, window_s: float,
                latency_pools: Sequence[str] = (), capacity_rps: float | None = None) -> PoolObservation:
        """The pool over the look-back (load, rate) and the window (latency); `latency_pools`: the
        pools whose requests' latency is this pool's (default: its own)."""
        recent = self.since(now_s, look_back_s)
        loads = [r.pools.get(pool, PoolLoad()) for r in recent[1:] or recent]
        rate = 0.0
        if len(recent) >= 2 and recent[-1].at_s > recent[0].at_s:
            first, last = recent[0].pools.get(pool, PoolLoad()), recent[-1].pools.get(pool, PoolLoad())
            sent = last.sent - first.sent if last.sent >= first.sent else last.sent  # a restart counts from 0
            rate = sent / (recent[-1].at_s - recent[0].at_s)
        span = self.since(now_s, window_s)
        mine = tuple(latency_pools) or (pool,)
        latency = {c.name: ClassLatency(
            ttft_ms=_tail(span, "ttft", c.name, mine, percentile),
            tpot_ms=_tail(span, "tpot", c.name, mine, percentile),
            ttft_target_ms=c.ttft_ms, tpot_target_ms=c.tpot_ms) for c in classes}
        n = max(len(loads), 1)
        return PoolObservation(pool=pool, role=role, replicas=replicas, serving=serving,
                               running=sum(x.running for x in loads) / n, waiting=sum(x.waiting for x in loads) / n,
                               request_rate=rate, classes=latency, capacity_rps=capacity_rps)

    def inflight(self) -> dict[str, int]:
        """Each replica's requests in flight, as the latest report has them."""
        if not self.reports:
            return {}
        return {rid: n for p in self.reports[-1].pools.values() for rid, n in p.inflight.items()}


def _tail(span: Sequence[Report], key: str, slo_class: str, pools: Sequence[str], percentile: float
          ) -> float | None:
    """The class's latency at `percentile` (ms) over the span: the last report's histograms less
    the first's, summed over `pools`."""
    if not span:
        return None
    last, first = span[-1], span[0]
    series_last: Mapping[tuple[str, str], Counts] = getattr(last, key)
    series_first: Mapping[tuple[str, str], Counts] = getattr(first, key) if len(span) > 1 else {}
    total: list[int] = [0] * (len(last.bounds) + 1)
    for pool in pools:
        now = series_last.get((slo_class, pool))
        if now is None:
            continue
        then = series_first.get((slo_class, pool), (0,) * len(now))
        if len(then) != len(now) or any(a < b for a, b in zip(now, then, strict=True)):
            then = (0,) * len(now)  # a router that restarted counts from 0 (Prometheus' `increase` does so)
        total = [t + a - b for t, a, b in zip(total, now, then, strict=True)]
    value = quantile(last.bounds, total, percentile / 100)
    return None if value is None else value * 1000.0
