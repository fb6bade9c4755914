"""The cost of each routing plugin, as one metric: `isle_router_plugin_duration_seconds{plugin,
kind}` (router/metrics.py). One decision in `every` is timed, stage by stage: each filter over
the whole snapshot, each scorer over every candidate, the picker, the PD pair; the others pay one
counter increment. The clock is injected (`time.perf_counter` live, a fake in tests)."""

from __future__ import annotations

from collections.abc import Callable

from router.metrics import Family, HistogramSeries

EVERY = 16
"""Decisions per timed one: two clock reads per plugin stay off 15 decisions of 16, and a router
at 1,000 requests/s still records ~60 samples per plugin per second."""


class PluginTimer:
    def __init__(self, family: Family, clock: Callable[[], float], every: int = EVERY) -> None:
        self.family = family
        self.clock = clock
        self.every = max(1, every)
        self.count = 0
        self._series: dict[tuple[str, str], HistogramSeries] = {}

    def due(self) -> bool:
        """Whether this decision is the one in `every` to time."""
        self.count += 1
        if self.count < self.every:
            return False
        self.count = 0
        return True

    def record(self, kind: str, plugin: str, seconds: float) -> None:
        key = (plugin, kind)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = self.family.labels_(plugin, kind)
        series.observe(seconds)
