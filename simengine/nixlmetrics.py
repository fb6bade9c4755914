"""The KV-connector metrics of vLLM 0.32's NixlConnector as its `PrometheusStatLogger` exports them
(vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py `NixlPromMetrics`): the same names,
types, labels (`model_name`, `engine`) and buckets, registered when an engine has a KV connector
(here: role prefill or decode, or a mixed engine at its first PD request). vLLM records them
per TP worker (each worker's transfer telemetry, aggregated): a decode engine at TP=t observes t
transfers per request, each its rank's shard.

    vllm:nixl_xfer_time_seconds           histogram  a transfer's duration (post to done)
    vllm:nixl_post_time_seconds           histogram  its post time
    vllm:nixl_bytes_transferred           histogram  its bytes
    vllm:nixl_num_descriptors             histogram  its descriptors (regions x blocks)
    vllm:nixl_num_failed_transfers        counter    failed transfers (handshakes, notifications too)
    vllm:nixl_num_failed_notifications    counter
    vllm:nixl_num_kv_expired_reqs         counter    (prefill side) held KV nobody read in time
    vllm:nixl_num_notifications_after_expiry  counter

vLLM's labels cannot say which prefill a transfer came from, so the engine adds its own, per
request and per prefill engine (`remote_engine_id` of the request's `kv_transfer_params`: a
replica id under the controller, so bounded):

    isle_engine_kv_transfer_seconds{remote_engine_id}        histogram  the whole handover
    isle_engine_kv_transfer_bytes_total{remote_engine_id}    counter    the whole KV
    isle_engine_kv_transfer_failures_total{remote_engine_id} counter
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from simengine.metrics import ENGINE

_TIME_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
XFER_TIME_BUCKETS = _TIME_BUCKETS[1:]
POST_TIME_BUCKETS = _TIME_BUCKETS
BYTES_BUCKETS = tuple(float(2 ** (10 + i)) for i in range(1, 25, 2))
"""vLLM's "uniform 2kb to 16gb range"."""
DESCRIPTOR_BUCKETS = (10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000, 50000)
HANDOVER_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""The engine's own per-request handover: finer than vLLM's at the low end (NVLink handovers)."""


class NixlMetrics:
    def __init__(self, registry: CollectorRegistry, model: str, eager: bool) -> None:
        self._registry, self._model = registry, model
        self._made = False
        if eager:
            self._make()

    def _make(self) -> None:
        if self._made:
            return
        self._made = True
        r, labels, values = self._registry, ["model_name", "engine"], (self._model, ENGINE)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=r).labels(*values)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=r).labels(*values)

        self.xfer_time = histogram("vllm:nixl_xfer_time_seconds",
                                   "Histogram of transfer duration for NIXL KV Cache transfers.", XFER_TIME_BUCKETS)
        self.post_time = histogram("vllm:nixl_post_time_seconds",
                                   "Histogram of transfer post time for NIXL KV Cache transfers.", POST_TIME_BUCKETS)
        self.bytes = histogram("vllm:nixl_bytes_transferred",
                               "Histogram of bytes transferred per NIXL KV Cache transfers.", BYTES_BUCKETS)
        self.descriptors = histogram("vllm:nixl_num_descriptors",
                                     "Histogram of number of descriptors per NIXL  KV Cache transfers.",
                                     DESCRIPTOR_BUCKETS)
        self.failed = counter("vllm:nixl_num_failed_transfers",
                              "Number of failed NIXL KV Cache transfers, including handshake and notification "
                              "failures. NOTE: KV expiry is tracked separately in vllm:nixl_num_kv_expired_reqs.")
        self.failed_notifications = counter("vllm:nixl_num_failed_notifications",
                                            "Number of failed NIXL KV Cache notifications. Retained for "
                                            "compatibility; these failures are also included in "
                                            "vllm:nixl_num_failed_transfers.")
        self.expired = counter("vllm:nixl_num_kv_expired_reqs", "Number of requests that had their KV expire. "
                               "NOTE: This metric is tracked on the P instance.")
        self.after_expiry = counter("vllm:nixl_num_notifications_after_expiry",
                                    "Number of completion notifications for requests that were no longer tracked, "
                                    "usually because their KV lease expired.")
        peer = [*labels, "remote_engine_id"]
        self.handover = Histogram("isle_engine_kv_transfer_seconds", "A remote prefill's KV read, whole (all TP "
                                  "ranks), per prefill engine.", peer, buckets=HANDOVER_BUCKETS, registry=r)
        self.handover_bytes = Counter("isle_engine_kv_transfer_bytes", "Bytes of KV read from each prefill engine.",
                                      peer, registry=r)
        self.handover_failures = Counter("isle_engine_kv_transfer_failures",
                                         "KV reads from each prefill engine that failed.", peer, registry=r)

    def transfer(self, peer: str, ranks: int, kv_bytes: float, seconds: float, post_s: float,
                 descriptors: int) -> None:
        """One request's KV read: `ranks` worker transfers of an equal shard each, all lasting
        the handover (vLLM's per-worker telemetry), and the engine's own per-peer record."""
        self._make()
        for _ in range(ranks):
            self.xfer_time.observe(seconds)
            self.post_time.observe(post_s)
            self.bytes.observe(kv_bytes / ranks)
            self.descriptors.observe(descriptors)
        values = (self._model, ENGINE, peer)
        self.handover.labels(*values).observe(seconds)
        self.handover_bytes.labels(*values).inc(kv_bytes)

    def failure(self, peer: str) -> None:
        self._make()
        self.failed.inc()
        self.handover_failures.labels(self._model, ENGINE, peer).inc()

    def kv_expired(self, requests: int = 1) -> None:
        self._make()
        self.expired.inc(requests)
