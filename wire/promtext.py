"""Prometheus text exposition read with prometheus_client's own parser: the one reader of the
engines' /metrics (vLLM's names; the simulated engine exports the same, simengine.metrics).

    scrape = parse(text, names=("vllm:num_requests_running", "vllm:time_to_first_token_seconds"))
    scrape.value("vllm:num_requests_running", model_name="m")   # summed over matching samples
    scrape.histogram("vllm:time_to_first_token_seconds")         # sum, count, cumulative buckets

Samples are kept by their own names (`x_total`, `x_bucket`, `x_sum`, `x_count`, `x_created`), so
what a family is called after the parser strips `_total` does not matter. `names` keeps only the
lines whose metric name starts with one of them before the parser sees the text: a vLLM scrape
is ~400 lines, almost all histogram buckets, and the router reads three gauges from it every
second for every replica. `engine_load` is that reading.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
"""vLLM's KV use gauge, then the name it had before v0.10."""
LOAD = (RUNNING, WAITING, *KV_USAGE)


class MetricsError(ValueError):
    """The text is not Prometheus exposition format."""


@dataclass(frozen=True, slots=True)
class Histogram:
    sum: float
    count: float
    buckets: tuple[tuple[float, float], ...]
    """(upper bound `le`, cumulative count), ascending; +Inf last when the text has it."""


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """An engine's load gauges (None: the scrape did not have it). Over DP engines (`engine`
    label) requests add up and KV use is their mean."""

    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None

    @property
    def busy(self) -> float:
        """Requests running or waiting."""
        return (self.running or 0.0) + (self.waiting or 0.0)


class Scrape:
    """One scrape's samples: sample name -> (labels, value) pairs."""

    __slots__ = ("samples",)

    def __init__(self, samples: Mapping[str, list[tuple[dict[str, str], float]]]) -> None:
        self.samples = samples

    def matching(self, name: str, labels: Mapping[str, str]) -> list[tuple[dict[str, str], float]]:
        return [(have, v) for have, v in self.samples.get(name, ())
                if all(have.get(k) == want for k, want in labels.items())]

    def value(self, name: str, **labels: str) -> float | None:
        """The sum of `name`'s samples whose labels include `labels`; None when none does."""
        found = self.matching(name, labels)
        return math.fsum(v for _, v in found) if found else None

    def mean(self, name: str, **labels: str) -> float | None:
        found = self.matching(name, labels)
        return math.fsum(v for _, v in found) / len(found) if found else None

    def total(self, *names: str, **labels: str) -> float:
        """The sum over several names (0 for names the scrape lacks)."""
        return math.fsum(self.value(n, **labels) or 0.0 for n in names)

    def histogram(self, name: str, **labels: str) -> Histogram | None:
        """`name`'s sum, count and buckets, added up over the matching label sets (engines)."""
        count = self.value(f"{name}_count", **labels)
        if count is None:
            return None
        by_le: dict[float, float] = {}
        for have, v in self.matching(f"{name}_bucket", labels):
            with_le = have.get("le")
            if with_le is not None:
                le = float(with_le)
                by_le[le] = by_le.get(le, 0.0) + v
        return Histogram(sum=self.value(f"{name}_sum", **labels) or 0.0, count=count,
                         buckets=tuple(sorted(by_le.items())))


def parse(text: str, names: Iterable[str] | None = None) -> Scrape:
    """The samples of `text`; with `names`, only those of metrics whose name starts with one."""
    if names is not None:
        text = _only(text, tuple(names))
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples.setdefault(s.name, []).append((s.labels, float(s.value)))
    except (ValueError, IndexError, KeyError) as err:
        raise MetricsError(f"not Prometheus text: {err}") from None
    return Scrape(samples)


def _only(text: str, prefixes: tuple[str, ...]) -> str:
    """The `# TYPE` and sample lines of metrics named `prefixes*` (HELP text is not needed)."""
    kept = [line for line in text.splitlines()
            if line.startswith(prefixes) or (line.startswith("# TYPE ") and line[7:].startswith(prefixes))]
    return "\n".join(kept) + "\n" if kept else ""


def engine_load(text: str) -> EngineLoad:
    """An engine's running and waiting requests and KV use, from its /metrics text."""
    scrape = parse(text, LOAD)
    kv = scrape.mean(KV_USAGE[0])
    return EngineLoad(running=scrape.value(RUNNING), waiting=scrape.value(WAITING),
                      kv_usage=kv if kv is not None else scrape.mean(KV_USAGE[1]))
