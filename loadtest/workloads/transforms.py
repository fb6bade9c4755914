"""What every workload goes through, in this order: time compression, rate scaling, truncation,
the SLO-class mix, then `finalize` (sorted by arrival, numbered 0..n-1).

Two ways to make a trace heavier, because they answer different questions:
- `compress_time(requests, k)`: the same requests in 1/k of the time (arrivals divided by k).
  The count stays; the run is k times shorter.
- `scale_rate(requests, k)`: k times the arrival rate over the same span. The trace is compressed
  by k and laid end to end k times (the last copy cut at the original span), so one hour of a
  trace at 16x holds 16 times its requests, and 0.5x keeps the first half of the trace stretched
  over the whole span. Each copy gets its own prefix-block ids (offset past the largest id), so
  copies do not hit each other's cache and the trace's share of repeated blocks is kept.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Mapping, Sequence

from loadtest.model import TraceRequest
from loadtest.workloads import WorkloadError


def _factor(k: float, what: str) -> float:
    if not (isinstance(k, int | float) and math.isfinite(k) and k > 0):
        raise WorkloadError(f"workload spec: {what} is {k!r}, must be a number > 0")
    return float(k)


def span_s(requests: Sequence[TraceRequest]) -> float:
    """The time a trace covers: its last arrival plus one mean gap (so copies laid end to end keep
    the trace's mean rate); 0 when every request arrives at once."""
    if len(requests) < 2:
        return 0.0
    first = min(r.arrival_s for r in requests)
    last = max(r.arrival_s for r in requests)
    return (last - first) * len(requests) / (len(requests) - 1)


def compress_time(requests: Sequence[TraceRequest], k: float) -> list[TraceRequest]:
    k = _factor(k, "time_scale")
    if k == 1.0:
        return list(requests)
    return [TraceRequest(index=r.index, arrival_s=r.arrival_s / k, prompt_tokens=r.prompt_tokens,
                         output_tokens=r.output_tokens, slo_class=r.slo_class, prefix_blocks=r.prefix_blocks,
                         block_tokens=r.block_tokens) for r in requests]


def scale_rate(requests: Sequence[TraceRequest], k: float) -> list[TraceRequest]:
    k = _factor(k, "rate_scale")
    if k == 1.0 or not requests:
        return list(requests)
    span = span_s(requests)
    if span <= 0:
        raise WorkloadError("workload spec: rate_scale: every request arrives at the same time, so the "
                            "trace has no rate to scale (use time_scale or a synthetic rate)")
    period = span / k
    first = min(r.arrival_s for r in requests)
    stride = 1 + max((h for r in requests for h in r.prefix_blocks), default=-1)
    out: list[TraceRequest] = []
    for copy in range(math.ceil(k)):
        offset, shift = copy * period, copy * stride
        out.extend(TraceRequest(
            index=r.index, arrival_s=at, prompt_tokens=r.prompt_tokens, output_tokens=r.output_tokens,
            slo_class=r.slo_class, block_tokens=r.block_tokens,
            prefix_blocks=tuple(h + shift for h in r.prefix_blocks) if shift else r.prefix_blocks)
            for r in requests if (at := offset + (r.arrival_s - first) / k) < span)
    return out


def step_rate(requests: Sequence[TraceRequest], steps: Sequence[tuple[float, float]], seed: int = 0
              ) -> list[TraceRequest]:
    """A load step: from each `(start_s, factor)` on, `factor` times the workload's rate (the
    trace copied to the largest factor, as `scale_rate` does, then thinned per segment with a
    seeded draw, so every segment keeps the trace's mix and burstiness)."""
    if not steps:
        return list(requests)
    if any(f <= 0 for _, f in steps) or any(b[0] <= a[0] for a, b in itertools.pairwise(steps)):
        raise WorkloadError("workload spec: rate_steps: [[start_s, factor], ...] with factors > 0 and starts "
                            "increasing")
    top = max(f for _, f in steps)
    dense = scale_rate(requests, top)
    rng = random.Random(seed)
    out = []
    for r in sorted(dense, key=lambda r: r.arrival_s):
        factor = next((f for start, f in reversed(steps) if r.arrival_s >= start), steps[0][1])
        if rng.random() < factor / top:
            out.append(r)
    return out


def truncate(requests: Sequence[TraceRequest], duration_s: float | None = None,
             max_requests: int | None = None) -> list[TraceRequest]:
    """Those arriving before `duration_s`, then the first `max_requests` of them by arrival."""
    kept = sorted(requests, key=lambda r: r.arrival_s)
    if duration_s is not None:
        kept = [r for r in kept if r.arrival_s < duration_s]
    return kept[:max_requests] if max_requests is not None else kept


def class_counts(mix: Mapping[str, float], n: int) -> dict[str, int]:
    """`n` split by the weights, rounded by largest remainder (ties to the earlier name): every
    count is within one of n * share and they add up to n."""
    total = sum(mix.values())
    if not mix or any(not (math.isfinite(w) and w >= 0) for w in mix.values()) or total <= 0:
        raise WorkloadError(f"workload spec: class_mix {dict(mix)} needs weights >= 0 with a positive sum")
    exact = {name: n * w / total for name, w in mix.items()}
    counts = {name: math.floor(x) for name, x in exact.items()}
    names = list(mix)
    by_remainder = sorted(names, key=lambda name: (-(exact[name] - counts[name]), names.index(name)))
    for name in by_remainder[: n - sum(counts.values())]:
        counts[name] += 1
    return counts


def assign_classes(requests: Sequence[TraceRequest], mix: Mapping[str, float], seed: int) -> list[TraceRequest]:
    """Each request's SLO class: exactly `class_counts` of each, in a seeded random order."""
    labels = [name for name, count in class_counts(mix, len(requests)).items() for _ in range(count)]
    random.Random(f"{seed}:classes").shuffle(labels)
    return [TraceRequest(index=r.index, arrival_s=r.arrival_s, prompt_tokens=r.prompt_tokens,
                         output_tokens=r.output_tokens, slo_class=label, prefix_blocks=r.prefix_blocks,
                         block_tokens=r.block_tokens) for r, label in zip(requests, labels, strict=True)]


def finalize(requests: Sequence[TraceRequest]) -> tuple[TraceRequest, ...]:
    """Sorted by arrival (stable), numbered in that order, the first arriving at its own time."""
    ordered = sorted(requests, key=lambda r: r.arrival_s)
    return tuple(r if r.index == i else dataclasses.replace(r, index=i) for i, r in enumerate(ordered))
