"""The routing table the controller publishes and every router replica follows (versioned)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from pools.model import GangMember, PlacementPlan, ReplicaPlacement, Role

EngineKind = Literal["sim", "vllm"]
"""What serves a replica: the simulated engine, or a real vLLM OpenAI server."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaEndpoint:
    replica_id: str
    url: str
    """Base URL of the engine's OpenAI server, e.g. http://127.0.0.1:8101 (no /v1)."""
    model: str
    """The served model id clients ask for."""
    pool: str
    role: Role
    node: str = ""
    gpus: tuple[int, ...] = ()
    island: str = ""
    tier: str = "local"
    tp: int = 1
    gpu_model: str | None = None
    catalog_model: str | None = None
    """Cost-model name of the model (for PD TTFT prediction), when it is in the catalogue."""
    healthy: bool = True
    health_score: float = 1.0
    """Worst link health inside the replica's TP group (1.0 healthy)."""
    draining: bool = False
    """Still serving what it has, but takes no new interactive traffic."""
    gang: str = ""
    """The gang this endpoint is one data-parallel rank of (external load balancing: the router
    balances the ranks itself); empty for an ordinary replica."""
    dp_rank: int = 0
    expert_parallel: int = 1
    """The GPUs the model's experts are split over when the endpoint is (a rank of) an
    expert-parallel gang (TP x DP of its pool); 1 otherwise. The router prices a rank's steps
    over its DP ranks' share of the experts and sizes its cache for its own GPUs (`router.plugins.ttft`)."""
    slo_classes: tuple[str, ...] = ()
    """The classes the replica's pool is declared for (its `slo_classes`); empty: every class."""
    max_num_seqs: int = 0
    """The engine's sequence limit (vLLM's max_num_seqs); 0: unknown (the router assumes vLLM's
    default, 256)."""
    kv_events_replay: str = ""
    """The engine's KV-event replay endpoint (`tcp://host:port`, vLLM's `replay_endpoint`): it
    publishes its prefix cache's events under its replica id as topic; empty: it publishes none."""
    kv_events: bool = False
    """The engine publishes its prefix cache's events to the router's `kv_events.endpoint`
    under its replica id as topic, without a replay endpoint (the controller starts its engines
    so: a gap is counted, not replayed). A replica with `kv_events_replay` publishes too."""
    engine: EngineKind = "sim"
    """What serves it (`EngineKind`). The router keys a prompt's KV blocks from the engine's own
    tokens: the simulated model's text pieces it computes itself, a vLLM replica's from that
    replica's tokenizer (`/tokenize`, `router.kvtokens`)."""

    @property
    def publishes(self) -> bool:
        """It publishes KV events (`kv_events`, or a replay endpoint)."""
        return self.kv_events or bool(self.kv_events_replay)


@dataclass(frozen=True, slots=True, kw_only=True)
class RoutingTable:
    version: int
    replicas: tuple[ReplicaEndpoint, ...]
    topology_fingerprint: str = ""
    epoch: str = ""
    """The controller incarnation that published it (empty: a table not from a controller)."""

    def supersedes(self, current: RoutingTable) -> bool:
        """A router takes this table over `current`: a higher version, or one from another
        controller incarnation whatever its version (a controller restarted while its disk was full
        resumes from the last state it could save, older than versions its predecessor published)."""
        return self.version > current.version or self.epoch != current.epoch

    def models(self) -> list[str]:
        return sorted({r.model for r in self.replicas})

    def with_replica(self, replica: ReplicaEndpoint) -> RoutingTable:
        others = tuple(r for r in self.replicas if r.replica_id != replica.replica_id)
        return replace(self, version=self.version + 1, replicas=(*others, replica))


def rank_id(replica_id: str, rank: int) -> str:
    """The endpoint id of data-parallel rank `rank` of gang `replica_id`."""
    return f"{replica_id}-dp{rank}"


def dp_ranks(p: ReplicaPlacement) -> list[tuple[int, GangMember]]:
    """A gang's data-parallel ranks with the member each is reached on (stage 0, its first node)."""
    seen: dict[int, GangMember] = {}
    for m in p.members:
        if m.pp_stage == 0:
            seen.setdefault(m.dp_rank_start, m)
    return sorted(seen.items())


def table_from_plan(plan: PlacementPlan, urls: dict[str, str], served_model: dict[str, str],
                    version: int = 1, gpu_models: dict[str, str | None] | None = None,
                    engine: EngineKind = "sim") -> RoutingTable:
    """Endpoints for the placed replicas that have a URL (pool -> served model name), each served
    by `engine`. A gang whose ranks have URLs of their own (`rank_id`) is one endpoint per
    data-parallel rank (vLLM's external load balancing), each with its rank's GPUs and the gang's
    tier; otherwise one."""
    out: list[ReplicaEndpoint] = []
    for p in plan.placements:
        pool = plan.pool(p.pool)
        base = ReplicaEndpoint(replica_id=p.replica_id, url=urls.get(p.replica_id, ""),
                               model=served_model.get(p.pool, pool.model or p.pool), pool=p.pool, role=p.role,
                               node=p.node, gpus=p.gpus, island=p.island, tier=p.tier, tp=pool.tp,
                               catalog_model=pool.model, gpu_model=(gpu_models or {}).get(p.replica_id),
                               slo_classes=pool.slo_classes,
                               expert_parallel=pool.ep_size, engine=engine)
        ranks = dp_ranks(p) if p.members and pool.dp > 1 else []
        if ranks and all(rank_id(p.replica_id, k) in urls for k, _ in ranks):
            out.extend(replace(base, replica_id=rank_id(p.replica_id, k), url=urls[rank_id(p.replica_id, k)],
                               node=m.node, gpus=m.gpus, gang=p.replica_id, dp_rank=k) for k, m in ranks)
        elif p.replica_id in urls:
            out.append(base)
    return RoutingTable(version=version, replicas=tuple(out), topology_fingerprint=plan.topology_fingerprint)
