"""The router's Prometheus metrics, defined once: `isle_router_*`, labelled by SLO class, pool and
topology tier (no unbounded labels: never a request id). `/metrics` renders this registry.

The per-request series (latency histograms, request counts) are plain counters that the event
loop updates without a lock — the router's loop is their only writer and `/metrics` is served on
that same loop — and a prometheus-client collector turns them into families when scraped. That
costs a bisect and two additions per observation instead of prometheus-client's locked values.

With several router workers (processes sharing the port), the worker that answers a scrape adds
its siblings' `snapshot()`s to its own: counters, histograms and in-flight counts are summed, a
replica counts as healthy only when every worker sends it traffic. One view, whichever worker
answers.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from router.kvmetrics import kv_path_families
from wire import native
from wire.limits import CAUSES

BUCKETS = tuple(float(f"{2.0 ** (k / 8):.4g}") for k in range(-80, 57))
"""Latency bucket bounds: 2^(k/8) s from 2^-10 (~1 ms) to 2^7 (128 s), the bounds of a Prometheus
native histogram of schema 3 written to 4 digits. Neighbours differ by 9.05% (+-0.01%), so
`histogram_quantile` (linear within a bucket) is within 9.1% of the true quantile wherever it
falls, even when every observation lands in one bucket (coarse 1-2-5 bounds said 3.8 s for a
p99 of 2.03 s)."""
FAST = (0.00001, 0.00003, 0.0001, 0.0003, 0.001, 0.003, 0.01)
RATIO = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99)
"""isle_router_prefix_hit_ratio: the share of a prompt's blocks its replica's cache held."""
PLUGIN = (0.000001, 0.000003, *FAST)
"""One routing plugin's stage: a compiled filter over a few replicas takes about a microsecond."""


class HistogramSeries:
    """One label combination of a histogram."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


class CounterSeries:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class Family:
    """A histogram or counter family: its series by label values."""

    def __init__(self, name: str, doc: str, labels: Sequence[str], buckets: tuple[float, ...] | None = None,
                 exposed: Sequence[str] | None = None) -> None:
        """`labels`: what each observation is kept by (the load report reads them all);
        `exposed`: the labels `/metrics` shows, series summed over the others (default: all)."""
        self.name, self.doc, self.labels, self.buckets = name, doc, tuple(labels), buckets
        self.exposed = tuple(labels if exposed is None else exposed)
        self._keep = tuple(self.labels.index(label) for label in self.exposed)
        self.series: dict[tuple[str, ...], Any] = {}

    def labels_(self, *values: str) -> Any:
        found = self.series.get(values)
        if found is None:
            if len(values) != len(self.labels):
                raise ValueError(f"{self.name} takes labels {self.labels}, got {values}")
            found = self.series[values] = (HistogramSeries(self.buckets) if self.buckets is not None
                                           else CounterSeries())
        return found

    def observe(self, value: float) -> None:
        """For a family without labels."""
        self.labels_().observe(value)

    def snapshot(self) -> list[list[Any]]:
        """[[label values, counts, sum] (histogram) or [label values, value] (counter)] (JSON)."""
        if self.buckets is None:
            return [[list(k), c.value] for k, c in self.series.items()]
        return [[list(k), list(h.counts), h.sum] for k, h in self.series.items()]

    def merged(self, peers: Sequence[list[list[Any]]]) -> dict[tuple[str, ...], Any]:
        """This family's series with the siblings' snapshots added (new objects; ours untouched)."""
        out: dict[tuple[str, ...], Any] = {}
        for values, own in self.series.items():
            if self.buckets is None:
                c = out[values] = CounterSeries()
                c.value = own.value
            else:
                h = out[values] = HistogramSeries(self.buckets)
                h.counts, h.sum = list(own.counts), own.sum
        for snap in peers:
            for row in snap:
                values = tuple(str(v) for v in row[0])
                if len(values) != len(self.labels):
                    continue  # a sibling of another version: skip what does not fit
                if self.buckets is None:
                    out.setdefault(values, CounterSeries()).value += float(row[1])
                elif len(row[1]) == len(self.buckets) + 1:
                    h = out.setdefault(values, HistogramSeries(self.buckets))
                    h.counts = [a + int(b) for a, b in zip(h.counts, row[1], strict=True)]
                    h.sum += float(row[2])
        return out

    def exposed_series(self, peers: Sequence[list[list[Any]]] = ()) -> dict[tuple[str, ...], Any]:
        """Every worker's series summed over the labels `/metrics` does not show."""
        series = self.merged(peers) if peers else self.series
        if len(self._keep) == len(self.labels):
            return series
        out: dict[tuple[str, ...], Any] = {}
        for values, s in series.items():
            key = tuple(values[i] for i in self._keep)
            if self.buckets is None:
                out.setdefault(key, CounterSeries()).value += s.value
            else:
                h = out.setdefault(key, HistogramSeries(self.buckets))
                h.counts = [a + b for a, b in zip(h.counts, s.counts, strict=True)]
                h.sum += s.sum
        return out

    def collect(self, peers: Sequence[list[list[Any]]] = ()) -> Metric:
        series = self.exposed_series(peers)
        if self.buckets is None:
            counter = CounterMetricFamily(self.name, self.doc, labels=self.exposed)
            for values, c in sorted(series.items()):
                counter.add_metric(list(values), c.value)
            return counter
        hist = HistogramMetricFamily(self.name, self.doc, labels=self.exposed)
        shown = shown_buckets(series.values(), len(self.buckets))
        bounds = (*(_go(b) for b in self.buckets), "+Inf")
        for values, h in sorted(series.items()):
            running, k, buckets = 0, 0, []
            for i in shown:
                while k <= i:
                    running += h.counts[k]
                    k += 1
                buckets.append((bounds[i], float(running)))
            hist.add_metric(list(values), buckets, h.sum)
        return hist


def shown_buckets(series: Iterable[HistogramSeries], bounds: int) -> list[int]:
    """The buckets `/metrics` shows of a histogram family: those any of its series has an
    observation in, each with the bucket below it (whose bound is the lower edge of the one
    above: linear interpolation needs it), and +Inf. Every series of the family shows the same
    bounds, so `sum by (le, ...)` over them adds like for like, and `histogram_quantile` of any
    sum gives what it would give over all `bounds` buckets: a bucket left out holds nothing.
    A bound shown stays shown (counts only grow): the series of a bucket never come and go.
    Most latencies fill a few octaves of the 17 the bounds span, so this is a fraction of the
    full layout (docs/operations.md: Metrics)."""
    filled = [False] * (bounds + 1)
    for h in series:
        for i, count in enumerate(h.counts):
            if count:
                filled[i] = True
    shown = [i for i in range(bounds) if filled[i] or filled[i + 1]]
    return [*shown, bounds]


class RouterMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        labels = ["slo_class", "pool", "tier"]
        self.ttft = Family("isle_router_ttft_seconds", "Time to first token seen by the router", labels, BUCKETS)
        self.tpot = Family("isle_router_tpot_seconds", "Mean time per output token of a request (the SLO "
                           "classes' tpot_ms: by class)", labels, BUCKETS, exposed=("slo_class",))
        self.itl = Family("isle_router_itl_seconds", "Gap between output tokens of a stream (the engine's decode "
                          "step: by pool)", labels, BUCKETS, exposed=("pool",))
        self.e2e = Family("isle_router_e2e_seconds", "Request latency end to end, from its first byte to its last "
                          "answered", labels, BUCKETS, exposed=("slo_class",))
        self.kv = Family("isle_router_kv_transfer_seconds", "Prefill-to-decode handover (PD)", labels, BUCKETS)
        self.kv_pair = Family("isle_kv_transfer_seconds", "A PD pair's KV transfer as the router measured it "
                              "(pair: prefill->decode, capped at pd.kv_path.max_pairs, then other)", ["tier", "pair"],
                              BUCKETS)
        self.kv_paths: Callable[[], Mapping[str, Any]] = dict
        """The pairs' verdicts now (`router.kvwatch.KvWatch.view`: `isle_kv_*` gauges)."""
        self.requests = Family("isle_router_requests", "Requests by SLO class and outcome", ["slo_class", "outcome"])
        self.rejections = Family("isle_router_rejections", "Requests refused, by SLO class ('unknown' before the "
                                 "class is known) and cause", ["slo_class", "cause"])
        self.fallbacks = Family("isle_router_class_fallbacks", "Requests of a class routed beyond the pools "
                                "declared for it because none of their replicas could take them", ["slo_class"])
        self.sent = Family("isle_router_pool_requests", "Requests (and PD legs) sent to a pool's replicas, "
                           "retries included (the autoscaler's arrival rate)", ["pool"])
        self.prefix_hit_blocks = Family("isle_router_prefix_hit_blocks", "Blocks of a prompt the prefix cache of "
                                        "the replica chosen to prefill it held, from the engines' KV events "
                                        "(config kv_events)", ["pool", "slo_class"])
        self.prefix_query_blocks = Family("isle_router_prefix_query_blocks", "Full blocks of the prompts routed "
                                          "with the KV-event index (the hit blocks' denominator)",
                                          ["pool", "slo_class"])
        self.prefix_hit_tokens = Family("isle_router_prefix_hit_tokens", "Prompt tokens the replica chosen to "
                                        "prefill it should read from its prefix cache, counted as vLLM counts "
                                        "vllm:prefix_cache_hits (whole blocks, never a prompt's last token)",
                                        ["pool", "slo_class"])
        self.prefix_query_tokens = Family("isle_router_prefix_query_tokens", "Prompt tokens of the requests keyed "
                                          "with the KV-event index, as their engines count them "
                                          "(vllm:prefix_cache_queries)", ["pool", "slo_class"])
        self.prefix_hit_ratio = Family("isle_router_prefix_hit_ratio", "Share of a prompt's full blocks the chosen "
                                       "replica's prefix cache held, per request", ["pool", "slo_class"], RATIO)
        self.prefix_fallbacks = Family("isle_router_prefix_fallbacks", "Requests a profile with the kv-cache-scorer "
                                       "routed by the prompt-hash affinity instead of the KV-event index, by reason: "
                                       "no_index (no kv_events), unkeyed (no replica of its model publishes, or its "
                                       "prompt could not be keyed)", ["pool", "slo_class", "reason"])
        self.replica_sent = Family("isle_router_replica_requests", "Requests (and PD legs) sent to each replica, "
                                   "retries included: which replicas receive traffic", ["replica"])
        self.lora_loads = Family("isle_router_lora_loads", "LoRA adapters the router loaded on a replica "
                                 "(/v1/load_lora_adapter), by outcome: loaded, failed", ["replica", "outcome"])
        self.lora_unloads = Family("isle_router_lora_unloads", "LoRA adapters the router unloaded from a replica, "
                                   "by reason: evicted (the coldest, to make room), admin", ["replica", "reason"])
        self.lora_load_seconds = Family("isle_router_lora_load_seconds", "Time an engine took to load an adapter "
                                        "(a request of a cold adapter waits for it)", [], BUCKETS)
        self.decision = Family("isle_router_decision_seconds", "Time to make a routing decision: kind=pd the "
                               "PD-or-mixed choice with the pair's pricing (every request long enough to split), "
                               "kind=replica the ranking of the class's replicas (every request not split)",
                               ["kind"], FAST)
        self.plugins = Family("isle_router_plugin_duration_seconds", "Time of one routing plugin's stage in a "
                              "sampled decision (router/plugins/timing.py)", ["plugin", "kind"], PLUGIN)
        self.healthy: dict[str, float] = {}
        """Replica id -> 1.0 when this worker sends it traffic (isle_router_replica_healthy)."""
        self.inflight: Mapping[str, int] = {}
        """Requests in flight by class: admission's own counts, read when /metrics is scraped."""
        self.peers: Sequence[Mapping[str, Any]] = ()
        """Sibling workers' snapshots, set only while rendering a merged view."""
        self.autoscaling: Mapping[str, Any] = {}
        """The controller's autoscaler as it last answered a load report (`isle_autoscale_*`)."""
        self.front_door: Callable[[], Mapping[str, Any]] = dict
        """The HTTP front door now (`wire.limits.ServerLimits.view`: `isle_router_front_door_*`)."""
        self.kv_index: Callable[[], Mapping[str, Any]] = dict
        """The prefix-cache index now (`router.kvindex.KvIndex.view`: `isle_router_kv_index_*`)."""
        self.controller: Mapping[str, Any] = {}
        """The controller's health from the plan it published last (`isle_controller_*`), set
        before a scrape renders."""
        r.register(_Families(self))
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def child(self, metric: Any, *labels: str) -> Any:
        """The series of `metric` with these label values (cached)."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = (metric.labels_(*labels) if isinstance(metric, Family)
                                           else metric.labels(*labels))
        return found

    def families(self) -> tuple[Family, ...]:
        return (self.ttft, self.tpot, self.itl, self.e2e, self.kv, self.kv_pair, self.requests, self.rejections,
                self.sent, self.replica_sent, self.fallbacks, self.decision, self.plugins, self.lora_loads,
                self.lora_unloads, self.lora_load_seconds, self.prefix_hit_blocks,
                self.prefix_query_blocks, self.prefix_hit_ratio, self.prefix_hit_tokens, self.prefix_query_tokens,
                self.prefix_fallbacks)

    def snapshot(self) -> dict[str, Any]:
        """This worker's series as JSON, for the sibling that answers a scrape."""
        return {"families": {f.name: f.snapshot() for f in self.families()}, "inflight": dict(self.inflight),
                "healthy": dict(self.healthy), "autoscaling": dict(self.autoscaling),
                "front_door": dict(self.front_door())}

    def render(self, peers: Sequence[Mapping[str, Any]] = ()) -> bytes:
        """The exposition text: this worker's series plus its siblings' snapshots."""
        self.peers = peers
        try:
            return generate_latest(self.registry)
        finally:
            self.peers = ()


class _Families(Collector):
    def __init__(self, metrics: RouterMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        for family in m.families():
            yield family.collect([p["families"].get(family.name, []) for p in m.peers])
        inflight = GaugeMetricFamily("isle_router_inflight_requests", "Requests in flight by SLO class",
                                     labels=["slo_class"])
        counts: dict[str, float] = {name: float(count) for name, count in m.inflight.items()}
        for p in m.peers:
            for name, count in p.get("inflight", {}).items():
                counts[name] = counts.get(name, 0.0) + float(count)
        for name, count in sorted(counts.items()):
            inflight.add_metric([name], count)
        yield inflight
        healthy = GaugeMetricFamily("isle_router_replica_healthy", "1 when the router sends traffic to the replica",
                                    labels=["replica"])
        views: dict[str, float] = dict(m.healthy)
        for p in m.peers:
            for replica, value in p.get("healthy", {}).items():
                views[replica] = min(views.get(replica, 1.0), float(value))
        for replica, value in sorted(views.items()):
            healthy.add_metric([replica], value)
        yield healthy
        yield from autoscale_families(m.autoscaling or next(
            (p["autoscaling"] for p in m.peers if p.get("autoscaling")), {}))  # the leader follows the controller
        yield from front_door_families([m.front_door(), *(p.get("front_door", {}) for p in m.peers)])
        yield from controller_families(m.controller)
        yield from kv_index_families(m.kv_index())
        yield from kv_path_families(m.kv_paths())
        build = InfoMetricFamily("isle_router_build", "How this router runs its request path (wire/native.py): "
                                 "native=compiled, or interpreted (slower: a build failed, is stale, or was "
                                 "turned off; the start-up line says why)")
        build.add_metric([], {"native": "compiled" if native.state() == "compiled" else "interpreted"})
        yield build


def kv_index_families(view: Mapping[str, Any]) -> Iterator[Metric]:
    """The engines' prefix caches as the router indexes them (config `kv_events`); nothing without."""
    if not view:
        return
    blocks = GaugeMetricFamily("isle_router_kv_index_blocks", "KV blocks the router's index holds for the "
                               "replica, from its KV events", labels=["replica"])
    for replica, n in sorted(view.get("blocks", {}).items()):
        blocks.add_metric([replica], float(n))
    yield blocks
    yield GaugeMetricFamily("isle_router_kv_index_lag_seconds", "From an engine's timestamp on its last KV event "
                            "batch to the router's receiving it", value=float(view.get("lag_s", 0.0)))
    yield CounterMetricFamily("isle_router_kv_event_batches", "KV event batches the router took in",
                              value=float(view.get("batches", 0)))
    yield CounterMetricFamily("isle_router_kv_event_gaps", "Gaps in an engine's KV event sequence (replayed "
                              "where the engine still had them)", value=float(view.get("gaps", 0)))
    yield CounterMetricFamily("isle_router_kv_event_orphans", "Stored blocks the index could not key (their "
                              "parent's event was missed, or their engine's block size is not kv_events.block_size)",
                              value=float(view.get("orphans", 0)))
    yield CounterMetricFamily("isle_router_kv_event_missed", "KV event batches lost for good (no replay had them: "
                              "the index may hold blocks an engine dropped)", value=float(view.get("missed", 0)))
    yield CounterMetricFamily("isle_router_kv_event_restarts", "Engines seen to restart (their sequence went back; "
                              "their blocks forgotten)", value=float(view.get("restarts", 0)))
    yield CounterMetricFamily("isle_router_kv_event_failures", "Event batches the index failed to take (kept "
                              "running)", value=float(view.get("failed", 0)))
    tokenize = CounterMetricFamily("isle_router_kv_tokenize_requests", "Prompts keyed for vLLM replicas from their "
                                   "tokenizer (POST /tokenize), by outcome: cached (kept keys), fetched, shared (one "
                                   "round trip for several), refused (a 4xx), failed, unreachable, unsupported (the "
                                   "last four: routed without the index)", labels=["outcome"])
    for outcome, n in sorted(view.get("tokenize", {}).items()):
        tokenize.add_metric([outcome], float(n))
    yield tokenize


def controller_families(health: Mapping[str, Any]) -> Iterator[Metric]:
    """The controller's health (control.state.alarms): degraded or not, the open alerts by kind,
    and its failed writes by kind since it started. Nothing without a controller."""
    if not health:
        return
    degraded = GaugeMetricFamily("isle_controller_degraded", "1 while the controller cannot write its state "
                                 "(state.json, events.jsonl or bench records: a full disk); it serves on from memory; "
                                 "or while it does not answer the router (router.contact)")
    degraded.add_metric([], 1.0 if health.get("status") == "degraded" else 0.0)
    alerts = GaugeMetricFamily("isle_controller_alert", "1 for each kind of write that fails now, and "
                               "controller_unreachable while the controller does not answer", labels=["kind"])
    for a in health.get("alerts", ()):
        alerts.add_metric([str(a.get("kind", ""))], 1.0)
    failures = CounterMetricFamily("isle_controller_write_failures", "Writes under the state directory that "
                                   "failed, by kind, since the controller started", labels=["kind"])
    for kind, count in sorted(dict(health.get("write_failures", {})).items()):
        failures.add_metric([str(kind)], float(count))
    yield from (degraded, alerts, failures)


def front_door_families(views: Sequence[Mapping[str, Any]]) -> Iterator[Metric]:
    """The HTTP front door of every worker, summed: refusals and closures by cause (every cause of
    `wire.limits.CAUSES`, zero included), open connections and buffered request bytes."""
    refusals = CounterMetricFamily("isle_router_front_door_refusals", "Connections and requests the HTTP front "
                                   "door refused or closed before any handler ran, by cause (caps per listener and "
                                   "per client address, 408/413/431/400, idle eviction, unread responses)",
                                   labels=["cause"])
    counts = dict.fromkeys(CAUSES, 0.0)
    connections = buffered = 0.0
    for view in views:
        for cause, count in dict(view.get("refused", {})).items():
            if cause in counts:
                counts[cause] += float(count)
        connections += float(view.get("connections", 0))
        buffered += float(view.get("buffered_bytes", 0))
    for cause, count in counts.items():
        refusals.add_metric([cause], count)
    yield refusals
    yield GaugeMetricFamily("isle_router_front_door_connections", "Open client connections", value=connections)
    yield GaugeMetricFamily("isle_router_front_door_buffered_bytes", "Request bytes held in memory (bodies as they "
                            "arrive, pipelined requests)", value=buffered)


def autoscale_families(view: Mapping[str, Any]) -> Iterator[Metric]:
    """The controller's autoscaler (`control.autoscaling.Autoscaling.status`): each pool's
    replicas (placed, serving, wanted, bounds), what it saw, and its decisions so far."""
    pools: Mapping[str, Any] = view.get("pools", {}) if view else {}
    replicas = GaugeMetricFamily("isle_autoscale_replicas", "An autoscaled pool's replicas: placed (starting "
                                 "included), serving, wanted (the policy's count), min and max",
                                 labels=["pool", "state"])
    rate = GaugeMetricFamily("isle_autoscale_request_rate", "Requests per second the autoscaler saw sent to the pool",
                             labels=["pool"])
    capacity = GaugeMetricFamily("isle_autoscale_capacity_rps", "Requests per second one replica carries within "
                                 "the SLO targets, as the autoscaler counts it (sizing model, learnt bound)",
                                 labels=["pool"])
    decisions = CounterMetricFamily("isle_autoscale_decisions", "Scale decisions the autoscaler acted on",
                                    labels=["pool", "direction"])
    for name, p in sorted(pools.items()):
        for state in ("placed", "serving", "wanted", "min", "max"):
            if p.get(state) is not None:
                replicas.add_metric([name, state], float(p[state]))
        rate.add_metric([name], float(p.get("request_rate", 0.0)))
        if p.get("capacity_rps") is not None:
            capacity.add_metric([name], float(p["capacity_rps"]))
        for direction in ("out", "in"):
            decisions.add_metric([name, direction], float(p.get(f"scaled_{direction}", 0)))
    yield from (replicas, rate, capacity, decisions)


def _go(bound: float) -> str:
    """A bucket bound as Prometheus writes it (`+Inf`, `0.005`, `1.0`)."""
    return str(floatToGoString(bound))  # type: ignore[no-untyped-call]
