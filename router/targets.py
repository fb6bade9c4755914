"""Prometheus' HTTP service discovery (`http_sd_config`): the router and every engine of its
routing table as scrape targets, so that Prometheus finds engines whose ports change at every
start. The answer is Prometheus' format, a JSON list of target groups:

    [{"targets": ["127.0.0.1:8000"], "labels": {"component": "router", "role": "router"}},
     {"targets": ["127.0.0.1:41337"], "labels": {"component": "engine", "replica": "decode-0",
      "pool": "decode", "role": "decode", "model": "llama-3.1-8b", "node": "h100-0",
      "island": "h100-0/island0", "tier": "nvlink"}}, ...]

An engine's labels become the labels of everything scraped from it (`vllm:*` by replica, not
by ip:port). The router's group has no `replica` label: its own `isle_router_replica_healthy`
has one, which a target label would rename. A label with no value is left out (Prometheus
drops empty labels). Served at `PATH` under the admin key (it lists the engines' addresses, as
`/admin/replicas` does): Prometheus sends it with `authorization: {credentials_file: ...}`
(configs/prometheus.yml). Pure: the table and the router's address in, bytes out."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

import orjson

from pools.routing import ReplicaEndpoint, RoutingTable

PATH = "/admin/prometheus/targets"
WILDCARDS = frozenset(("", "0.0.0.0", "::", "[::]"))


def router_address(host: str, port: int, headers: Mapping[str, str]) -> str:
    """The address Prometheus scrapes the router on: its listening host and port, or, when it
    listens on every address, the `Host` the discovery request came to (the one Prometheus
    reached it on)."""
    if host in WILDCARDS:
        asked = headers.get("host", "").strip()
        if asked:
            return asked
        host = "127.0.0.1"
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def engine_labels(replica: ReplicaEndpoint) -> dict[str, str]:
    labels = {"component": "engine", "replica": replica.replica_id, "pool": replica.pool, "role": replica.role,
              "model": replica.model, "node": replica.node, "island": replica.island, "tier": replica.tier,
              "gang": replica.gang}
    return {name: value for name, value in labels.items() if value}


def target_groups(table: RoutingTable, router: str) -> list[dict[str, object]]:
    """The router at `router` (host:port), then every engine with an address, by replica id."""
    groups: list[dict[str, object]] = [{"targets": [router], "labels": {"component": "router", "role": "router"}}]
    for replica in sorted(table.replicas, key=lambda r: r.replica_id):
        netloc = urlsplit(replica.url).netloc
        if netloc:
            groups.append({"targets": [netloc], "labels": engine_labels(replica)})
    return groups


def targets_body(table: RoutingTable, router: str) -> bytes:
    return orjson.dumps(target_groups(table, router))
