"""The router's test kit: candidates and requests for the routing decisions, as plain values."""

from __future__ import annotations

from pools.model import DEFAULT_SLO_CLASSES
from pools.routing import ReplicaEndpoint
from router.plugins.model import Candidate, ReplicaLoad, RouteRequest

INTERACTIVE, STANDARD, BATCH = DEFAULT_SLO_CLASSES


def cand(rid: str, role: str = "mixed", load: ReplicaLoad | None = None, **kw: object) -> Candidate:
    ep = ReplicaEndpoint(replica_id=rid, url=f"http://127.0.0.1:1/{rid}", model="m", pool="p", role=role,  # type: ignore[arg-type]
                         **kw)  # type: ignore[arg-type]
    return Candidate(endpoint=ep, load=load or ReplicaLoad())


def req(slo: object = STANDARD, tokens: int = 100, prefix: int = 0) -> RouteRequest:
    return RouteRequest(model="m", slo_class=slo, prompt_tokens=tokens, prefix_hash=prefix)  # type: ignore[arg-type]
