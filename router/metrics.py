"""The router's Prometheus metrics, defined once: `isle_router_*`, labelled by SLO class, pool and
topology tier (no unbounded labels: never a request id). `/metrics` renders this registry."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
FAST = (0.00001, 0.00003, 0.0001, 0.0003, 0.001, 0.003, 0.01)


class RouterMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        labels = ["slo_class", "pool", "tier"]
        self.ttft = Histogram("isle_router_ttft_seconds", "Time to first token seen by the router", labels,
                              buckets=BUCKETS, registry=r)
        self.tpot = Histogram("isle_router_tpot_seconds", "Mean time per output token of a request", labels,
                              buckets=BUCKETS, registry=r)
        self.itl = Histogram("isle_router_itl_seconds", "Gap between streamed chunks", labels, buckets=BUCKETS,
                             registry=r)
        self.e2e = Histogram("isle_router_e2e_seconds", "Request latency end to end", labels, buckets=BUCKETS,
                             registry=r)
        self.kv = Histogram("isle_router_kv_transfer_seconds", "Prefill-to-decode handover (PD)", labels,
                            buckets=BUCKETS, registry=r)
        self.requests = Counter("isle_router_requests", "Requests by SLO class and outcome", ["slo_class", "outcome"],
                                registry=r)
        self.decision = Histogram("isle_router_decision_seconds", "Time to make a routing decision", buckets=FAST,
                                  registry=r)
        self.healthy = Gauge("isle_router_replica_healthy", "1 when the router sends traffic to the replica",
                             ["replica"], registry=r)
        self.inflight: Mapping[str, int] = {}
        """Requests in flight by class: admission's own counts, read when /metrics is scraped."""
        r.register(_Inflight(self))

        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, cached: the label lookup costs more than the observation."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Inflight(Collector):
    def __init__(self, metrics: RouterMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("isle_router_inflight_requests", "Requests in flight by SLO class",
                                   labels=["slo_class"])
        for name, count in sorted(self.metrics.inflight.items()):
            family.add_metric([name], float(count))
        yield family
