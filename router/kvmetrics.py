"""The PD pairs' KV-path verdicts as Prometheus gauges, from `router.kvwatch.KvWatch.view`
(a plain mapping, so the metrics module needs nothing of the router's decisions)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric


def kv_path_families(view: Mapping[str, Any]) -> Iterator[Metric]:
    """`isle_kv_transfer_bandwidth_ratio{pair}`, `isle_kv_pair_verdict{pair,verdict}` (1 for the
    pair's verdict, 0 for the others) and the decodes' NIXL bandwidth; nothing before a pair."""
    pairs = view.get("pairs") or []
    if not pairs and not view.get("decodes"):
        return
    ratio = GaugeMetricFamily("isle_kv_transfer_bandwidth_ratio", "A PD pair's measured KV bandwidth over its "
                              "path's expected bandwidth", labels=["pair"])
    verdict = GaugeMetricFamily("isle_kv_pair_verdict", "1 for a PD pair's KV-path verdict (as_planned, slow, "
                                "wrong_path, failing)", labels=["pair", "verdict"])
    for row in pairs:
        ratio.add_metric([row["pair"]], float(row["bandwidth_ratio"]))
        for name in view.get("verdicts") or ():
            verdict.add_metric([row["pair"], name], 1.0 if row["verdict"] == name else 0.0)
    nixl = GaugeMetricFamily("isle_kv_nixl_bandwidth_gbps", "A decode replica's NIXL KV bandwidth over the last "
                             "scrape window (GB/s), from its vllm:nixl_* counters", labels=["replica"])
    for replica, row in (view.get("decodes") or {}).items():
        nixl.add_metric([replica], float(row["nixl_bandwidth_gb_s"]))
    yield from (ratio, verdict, nixl)
