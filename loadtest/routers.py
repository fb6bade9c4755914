"""The routers `python -m loadtest compare --routers` sets side by side, by name: what the router
knows of the engines' prefix caches and how it weighs it. The engines are the same in every run
(prefix caching on, as vLLM's default); only the router changes.

- `round-robin`: replicas in turn, nothing known.
- `prefix-hash`: the prompt's leading blocks hashed to a preferred replica (rendezvous), with the
  queue depth: what this product did before KV events (`prefix-affinity-scorer`).
- `kv-events`: the engines' KV events indexed (`router.kvindex`): the share of the prompt a
  replica's cache holds, with the queue depth (`kv-cache-scorer`; what llm-d's precise
  prefix-cache scorer and load scorer do).
- `kv-events+topology`: the same, and a prefix a peer holds counts for a replica that could pull
  it over the topology's paths faster than it would compute it, discounted by the pull's cost
  (`kv-cache-scorer` with `peer_pull`, `router.plugins.pull`): the deployment's KV connector
  reads it from the peer. Where no pull pays, it decides as `kv-events` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class RouterChoice:
    name: str
    profile: Mapping[str, Any]
    """The default routing profile (router config `default_profile`; every class uses it)."""
    kv_events: bool
    """The router indexes the engines' KV events."""


ROUTERS: dict[str, RouterChoice] = {r.name: r for r in (
    RouterChoice("round-robin", {"scorers": {}, "picker": "round-robin-picker"}, False),
    RouterChoice("prefix-hash", {"scorers": {"prefix-affinity-scorer": 1.0, "queue-depth-scorer": 1.0}}, False),
    RouterChoice("kv-events", {"scorers": {"kv-cache-scorer": 1.0, "queue-depth-scorer": 1.0}}, True),
    RouterChoice("kv-events+topology",
                 {"scorers": {"kv-cache-scorer": {"weight": 1.0, "parameters": {"peer_pull": True}},
                              "queue-depth-scorer": 1.0}}, True),
)}


def routers(names: str) -> list[RouterChoice]:
    """`--routers a,b,c`, checked."""
    chosen = [n for n in names.split(",") if n]
    bad = [n for n in chosen if n not in ROUTERS]
    if bad or not chosen:
        raise ValueError(f"--routers: unknown {bad} (known: {', '.join(ROUTERS)})" if bad else
                         "--routers: name at least one")
    return [ROUTERS[n] for n in chosen]
