"""The router's load report to the controller's autoscaler: a typed value with its JSON form.

The router (`router.server.Router.load_report`) builds one every second; the app sends its JSON
(`to_json`) to the controller, which reads it back with `LoadReport.from_json`, checking every
figure: numbers finite and non-negative (no NaN, no infinity), counts whole, names short strings,
and every list and map of a bounded size, so a forged or broken report cannot poison the window
the autoscaler decides on (`pools.autoscale.observe`). Figures are cumulative, so a missed report
loses nothing; a figure that went down means the router restarted and counts from zero again.

    {"buckets": [upper bounds of the latency histograms, s],
     "pools": {POOL: {"running": float, "waiting": float, "sent": int,
                      "inflight": {REPLICA: int}}},
     "ttft": [[SLO_CLASS, POOL, [count per bucket, +Inf last]], ...],
     "tpot": [...],
     "kv_paths": [each prefill -> decode pair's KV-path verdict (`pools.kvpaths`)]}

The KV-path verdicts ride along for the controller's `kv_path` events and actions
(`control.kvpaths`), not for the autoscaler.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from pools.kvpaths import MAX_PAIRS, PairVerdict, bounded_name, verdicts_from_json

Counts = tuple[int, ...]
KEYS = ("buckets", "pools", "ttft", "tpot", "kv_paths")
_COUNT = {"type": "integer", "minimum": 0, "maximum": 1 << 53}
_NAME = {"type": "string", "minLength": 1, "maxLength": 256}
_SERIES = {"type": "array", "maxItems": 4096, "items": {
    "type": "array", "prefixItems": [_NAME, _NAME, {"type": "array", "items": _COUNT}], "minItems": 3, "maxItems": 3}}
SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "isleserve load report",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "buckets": {"type": "array", "maxItems": 512, "items": {"type": "number", "minimum": 0, "maximum": 1e7}},
        "pools": {"type": "object", "maxProperties": 256, "propertyNames": {"maxLength": 256, "minLength": 1},
                  "additionalProperties": {"type": "object", "properties": {
                      "running": {"type": "number", "minimum": 0, "maximum": 1e7},
                      "waiting": {"type": "number", "minimum": 0, "maximum": 1e7},
                      "sent": _COUNT,
                      "inflight": {"type": "object", "maxProperties": 4096, "additionalProperties": _COUNT}}}},
        "ttft": _SERIES,
        "tpot": _SERIES,
        "kv_paths": {"type": "array", "maxItems": MAX_PAIRS, "items": {"type": "object"}},
    },
}
"""The JSON form as a JSON Schema (for other routers and for tests; `from_json` checks more: bucket
bounds increase, each histogram has one count per bound plus +Inf)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolLoad:
    running: float = 0.0
    waiting: float = 0.0
    sent: int = 0
    inflight: Mapping[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"running": self.running, "waiting": self.waiting, "sent": self.sent, "inflight": dict(self.inflight)}


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadReport:
    buckets: tuple[float, ...] = ()
    """Upper bounds of the latency histograms, in seconds (+Inf implied last)."""
    pools: Mapping[str, PoolLoad] = field(default_factory=dict)
    ttft: Mapping[tuple[str, str], Counts] = field(default_factory=dict)
    """(SLO class, pool) -> cumulative count per bucket, +Inf last."""
    tpot: Mapping[tuple[str, str], Counts] = field(default_factory=dict)
    kv_paths: tuple[PairVerdict, ...] = ()
    """Each followed prefill -> decode pair's KV-path verdict (`pools.kvpaths`)."""

    def to_json(self) -> dict[str, Any]:
        return {"buckets": list(self.buckets), "pools": {k: p.to_json() for k, p in self.pools.items()},
                "ttft": [[c, p, list(n)] for (c, p), n in sorted(self.ttft.items())],
                "tpot": [[c, p, list(n)] for (c, p), n in sorted(self.tpot.items())],
                "kv_paths": [v.to_json() for v in self.kv_paths]}

    @staticmethod
    def from_json(doc: Any) -> LoadReport:
        """The report `doc` is (module docstring), every figure checked; ValueError when it is not one."""
        report = _mapping(doc, "a load report", 8)
        unknown = set(report) - set(KEYS)
        if unknown:
            raise ValueError(f"load report: unknown keys {sorted(unknown)}")
        bounds = _bounds(report.get("buckets", []))
        pools = dict(_pool(name, raw) for name, raw in _mapping(report.get("pools", {}), "pools", MAX_POOLS).items())
        return LoadReport(buckets=bounds, pools=pools, ttft=_series(report.get("ttft", []), "ttft", len(bounds) + 1),
                          tpot=_series(report.get("tpot", []), "tpot", len(bounds) + 1),
                          kv_paths=verdicts_from_json(report.get("kv_paths", [])))


MAX_POOLS = 256
MAX_REPLICAS = 4096
MAX_BUCKETS = 512
MAX_SERIES = 4096
MAX_GAUGE = 1e7
"""Requests running or waiting in one pool: more than any deployment holds."""
MAX_COUNT = 1 << 53
"""A cumulative count (requests sent, observations in a bucket): still exact as a float."""


def _gauge(value: Any, what: str) -> float:
    """A finite, non-negative number no larger than MAX_GAUGE (NaN and infinities refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number")
    number = float(value)
    if not 0.0 <= number <= MAX_GAUGE:  # also false for NaN
        raise ValueError(f"{what} must be finite, between 0 and {MAX_GAUGE:g} (got {value!r})")
    return number


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise ValueError(f"{what} must be a whole number between 0 and 2**53 (got {value!r})")
    return value


def _mapping(value: Any, what: str, most: int) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be an object")
    if len(value) > most:
        raise ValueError(f"{what} has {len(value)} entries (at most {most})")
    return value


def _bounds(raw: Any) -> tuple[float, ...]:
    if not isinstance(raw, list) or len(raw) > MAX_BUCKETS:
        raise ValueError(f"buckets must be a list of at most {MAX_BUCKETS} bounds")
    bounds = tuple(_gauge(b, "a bucket bound") for b in raw)
    if any(later <= earlier for earlier, later in pairwise(bounds)):
        raise ValueError("bucket bounds must increase")
    return bounds


def _pool(name: Any, raw: Any) -> tuple[str, PoolLoad]:
    where = f"pools[{name!r}]"
    doc = _mapping(raw, where, 8)
    inflight = _mapping(doc.get("inflight", {}), f"{where}.inflight", MAX_REPLICAS)
    return bounded_name(name, "a pool name"), PoolLoad(
        running=_gauge(doc.get("running", 0.0), f"{where}.running"),
        waiting=_gauge(doc.get("waiting", 0.0), f"{where}.waiting"),
        sent=_count(doc.get("sent", 0), f"{where}.sent"),
        inflight={bounded_name(k, "a replica id"): _count(v, f"{where}.inflight[{k!r}]") for k, v in inflight.items()})


def _series(raw: Any, key: str, buckets: int) -> dict[tuple[str, str], Counts]:
    if not isinstance(raw, list) or len(raw) > MAX_SERIES:
        raise ValueError(f"{key} must be a list of at most {MAX_SERIES} series")
    out: dict[tuple[str, str], Counts] = {}
    for entry in raw:
        if not isinstance(entry, list) or len(entry) != 3 or not isinstance(entry[2], list):
            raise ValueError(f"each {key} series is [SLO_CLASS, POOL, [counts]]")
        klass, pool, counts = entry
        if len(counts) != buckets:
            raise ValueError(f"load report: {key} histograms need {buckets} counts (the bounds and +Inf)")
        out[(bounded_name(klass, "an SLO class"), bounded_name(pool, "a pool name"))] = tuple(
            _count(n, f"a {key} count") for n in counts)
    return out
