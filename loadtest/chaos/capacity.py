"""The deployment's capacity for the chaos workload, from the offline simulator on the deployed
plan (the same placement, engines' batching and router decisions; no CPU limits of this
machine): the highest Poisson rate, in modelled requests per second, at which a probe run meets
every class's SLO for at least `ATTAINMENT` of its requests. Doubling, then bisection."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from isleserve.settings import AppArgs
from loadtest.chaos.load import RequestFactory
from loadtest.live.timings import simulate_deployment
from loadtest.summary import summarize

ATTAINMENT = 0.95
PROBE_S = 20.0
"""Modelled seconds of traffic per probe."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Capacity:
    rps: float
    """Modelled requests per second."""
    probes: tuple[tuple[float, float], ...]
    """(rate, worst class attainment) of every probe, in the order run."""


def worst_attainment(args: AppArgs, factory: RequestFactory, rate_rps: float, probe_s: float = PROBE_S) -> float:
    workload = factory.trace(rate_rps, probe_s)
    if not workload:
        return 1.0
    summary = summarize(simulate_deployment(args, workload), args.router.classes(), probe_s)
    return float(min(c["slo_attainment"] for c in summary["per_class"].values()))


def search(meets: Callable[[float], float], start_rps: float = 8.0, ceiling_rps: float = 4096.0,
           steps: int = 5) -> Capacity:
    """The highest rate with `meets(rate) >= ATTAINMENT` (pure over `meets`)."""
    probes: list[tuple[float, float]] = []

    def ok(rate: float) -> bool:
        probes.append((rate, meets(rate)))
        return probes[-1][1] >= ATTAINMENT

    lo, hi = 0.0, start_rps
    while hi <= ceiling_rps and ok(hi):
        lo, hi = hi, hi * 2
    if lo == 0.0:
        hi, lo = start_rps, 0.0
    for _ in range(steps):
        mid = (lo + hi) / 2
        if mid <= 0:
            break
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return Capacity(rps=round(lo, 2), probes=tuple((round(r, 2), round(a, 4)) for r, a in probes))


def estimate(args: AppArgs, factory: RequestFactory) -> Capacity:
    return search(lambda rate: worst_attainment(args, factory, rate))
