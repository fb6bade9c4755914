"""What runs where: pool and replica specs, SLO classes, placements and plans.

Shared vocabulary: the router imports `SLOClass` and plans from here (DESIGN.md). All frozen.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from topology import GpuRef, Tier, Topology
from topology.paths import TIERS

Role = Literal["prefill", "decode", "mixed"]
ROLES: tuple[Role, ...] = ("prefill", "decode", "mixed")


@dataclass(frozen=True, slots=True, kw_only=True)
class SLOClass:
    """A class of service. Lower `priority` is served first (vLLM's convention)."""

    name: str
    priority: int
    ttft_ms: float
    tpot_ms: float
    sheddable: bool = False
    max_concurrency: int | None = None
    max_queue_ms: float | None = None

    def strictness(self) -> float:
        """Bigger is stricter: used to give strict classes the best islands first."""
        return 1000.0 / max(self.ttft_ms, 1.0) + 100.0 / max(self.tpot_ms, 1.0) - 0.01 * self.priority


DEFAULT_SLO_CLASSES: tuple[SLOClass, ...] = (
    SLOClass(name="interactive", priority=0, ttft_ms=500.0, tpot_ms=50.0),
    SLOClass(name="standard", priority=1, ttft_ms=2000.0, tpot_ms=100.0),
    SLOClass(name="batch", priority=2, ttft_ms=30000.0, tpot_ms=500.0, sheddable=True),
)


@dataclass(frozen=True, slots=True)
class ExpertChoice:
    """How an EP gang maps its experts (`pools.experts`): a policy, a load (a file or
    `zipf:SKEW[:SEED]`), redundant experts, and whether a token uses a copy of an expert in its
    own NVLink domain (`locality`: the isleserve vLLM plugin) or any copy (vLLM's own choice)."""

    policy: str
    load: str = "zipf:1.3"
    redundant: int = 0
    locality: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertFigures:
    """What a placed EP gang's expert map does (`isle status`, `/admin/plan`)."""

    policy: str
    redundant: int
    balancedness: float
    cross_domain_share: float
    domain_load: tuple[tuple[str, float], ...] = ()
    """Each NVLink domain's share of the gang's expert load."""

    def to_json(self) -> dict[str, Any]:
        return {"policy": self.policy, "redundant": self.redundant, "balancedness": round(self.balancedness, 4),
                "cross_domain_share": round(self.cross_domain_share, 4),
                "domain_load": {d: round(x, 4) for d, x in self.domain_load}}


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaSpec:
    model: str | None
    tp: int
    role: Role
    memory_gb: float | None = None
    """Per-GPU memory the replica needs (weights / tp + KV reserve); None when unknown."""
    pp: int = 1
    dp: int = 1
    expert_parallel: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolSpec:
    name: str
    role: Role
    tp: int
    replicas: int
    model: str | None = None
    slo_classes: tuple[str, ...] = ()
    require_island: bool = False
    """True: a replica that cannot sit inside one island stays unplaced (never crosses)."""
    pp: int = 1
    """Pipeline stages (each stage dp x tp GPUs)."""
    dp: int = 1
    """Data-parallel attention ranks (each tp GPUs), one engine per rank (vLLM --data-parallel-size)."""
    expert_parallel: bool = False
    """MoE experts split over the tp x dp GPUs of a stage (vLLM --enable-expert-parallel)."""
    require_domain: bool = False
    """True: a gang that no NVLink domain can hold stays unplaced (never spans domains)."""
    experts: ExpertChoice | None = None
    """An EP gang's expert map, computed with the plan (None: not computed)."""

    @property
    def gang_size(self) -> int:
        """GPUs one replica takes: tp x pp x dp."""
        return self.tp * self.pp * self.dp

    @property
    def is_gang(self) -> bool:
        """More than one TP group per replica (data-parallel ranks or pipeline stages)."""
        return self.pp > 1 or self.dp > 1

    @property
    def ep_size(self) -> int:
        """Expert-parallel size: tp x dp with expert parallelism, else 1 (experts split by TP)."""
        return self.tp * self.dp if self.expert_parallel else 1

    def replica(self, memory_gb: float | None = None) -> ReplicaSpec:
        return ReplicaSpec(model=self.model, tp=self.tp, role=self.role, memory_gb=memory_gb, pp=self.pp, dp=self.dp,
                           expert_parallel=self.expert_parallel)


@dataclass(frozen=True, slots=True, kw_only=True)
class GangMember:
    """The GPUs of one data-parallel rank in one pipeline stage on one node (a TP group, or its
    share of a node when the TP group spans an NVLink domain's nodes)."""

    node: str
    gpus: tuple[int, ...]
    dp_rank_start: int
    pp_stage: int = 0
    nic: str | None = None
    """The NIC nearest these GPUs (the rank's rail), None when the node has no NIC."""

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "gpus": list(self.gpus), "dp_rank_start": self.dp_rank_start,
                "pp_stage": self.pp_stage, "nic": self.nic}


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaPlacement:
    replica_id: str
    pool: str
    role: Role
    node: str
    gpus: tuple[int, ...]
    island: str
    """The island holding the group, or 'a+b' when it spans islands."""
    tier: Tier
    in_island: bool
    reasons: tuple[str, ...] = ()
    extra_nodes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    """GPUs on further nodes when a group spans nodes (only topology-blind baselines do that)."""
    members: tuple[GangMember, ...] = ()
    """A gang's rank groups in rank order (stage by stage, DP ranks within a stage); `node` and
    `gpus` are then its first member's, `extra_nodes` its GPUs on other nodes."""
    in_domain: bool = True
    """All the replica's GPUs are in one NVLink domain (island)."""
    expert_parallel: bool = False
    experts: ExpertFigures | None = None
    """Its expert map's figures, when its pool asks for one."""

    def gpu_refs(self) -> list[tuple[str, int]]:
        if self.members:
            return [(m.node, g) for m in self.members for g in m.gpus]
        refs = [(self.node, g) for g in self.gpus]
        for node, gpus in self.extra_nodes:
            refs.extend((node, g) for g in gpus)
        return refs


@dataclass(frozen=True, slots=True, kw_only=True)
class Unplaced:
    pool: str
    count: int
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PlacementPlan:
    policy: str
    topology_fingerprint: str
    placements: tuple[ReplicaPlacement, ...]
    unplaced: tuple[Unplaced, ...] = ()
    score: float = 0.0
    reasons: tuple[str, ...] = ()
    pools: tuple[PoolSpec, ...] = field(default=(), compare=False)
    slo_classes: Mapping[str, SLOClass] = field(default_factory=dict, compare=False)
    """The classes the plan was made with (a re-plan orders and prefers by them again)."""
    cross_domain_ep: int = 0
    """EP gangs not inside one NVLink domain although a domain could have held them: one whose
    healthy GPUs, less those other EP gangs hold inside it, are at least the gang's size (the
    replicas there could have gone elsewhere). Counted when the plan is made."""
    pp_boundaries: Mapping[str, int] = field(default_factory=dict)
    """Pipeline stage boundaries per tier of the link that carries them."""

    def pool(self, name: str) -> PoolSpec:
        return next(p for p in self.pools if p.name == name)

    def new_ids(self, pool: str, count: int, taken: Iterable[str] = ()) -> tuple[str, ...]:
        """Ids for `count` more replicas of `pool`: the lowest `<pool>-<k>` that neither the plan
        nor `taken` (replicas still draining, say) uses."""
        used = {p.replica_id for p in self.placements} | set(taken)
        out: list[str] = []
        k = 0
        while len(out) < count:
            if (rid := f"{pool}-{k}") not in used:
                out.append(rid)
            k += 1
        return tuple(out)

    @property
    def gpus_used(self) -> int:
        return sum(len(p.gpu_refs()) for p in self.placements)

    @property
    def cross_island_tp_groups(self) -> int:
        return sum(1 for p in self.placements if len(p.gpu_refs()) > 1 and not p.in_island)

    @property
    def cross_domain_ep_groups(self) -> int:
        return self.cross_domain_ep

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "topology_fingerprint": self.topology_fingerprint,
            "placements": [
                {"replica_id": p.replica_id, "pool": p.pool, "role": p.role, "node": p.node, "gpus": list(p.gpus),
                 "island": p.island, "tier": p.tier, **({"extra_nodes": {n: list(g) for n, g in p.extra_nodes}}
                                                       if p.extra_nodes else {}),
                 **({"members": [m.to_json() for m in p.members], "in_domain": p.in_domain,
                     "expert_parallel": p.expert_parallel} if p.members else {}),
                 **({"experts": p.experts.to_json()} if p.experts is not None else {}),
                 "reasons": list(p.reasons)}
                for p in self.placements
            ],
            "unplaced": [{"pool": u.pool, "count": u.count, "reason": u.reason} for u in self.unplaced],
            "summary": {"gpus_used": self.gpus_used, "cross_island_tp_groups": self.cross_island_tp_groups,
                        "cross_domain_ep_groups": self.cross_domain_ep_groups,
                        "pp_boundaries": dict(sorted(self.pp_boundaries.items())),
                        "score": round(self.score, 4)},
            "reasons": list(self.reasons),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class PlacementRequest:
    topology: Topology
    pools: tuple[PoolSpec, ...]
    slo_classes: Mapping[str, SLOClass] = field(default_factory=lambda: {c.name: c for c in DEFAULT_SLO_CLASSES})
    seed: int = 0
    occupied: frozenset[GpuRef] = frozenset()
    """GPUs already held (by replicas a re-plan keeps): no policy may use them."""
    ids: Mapping[str, tuple[str, ...]] | None = None
    """Replica ids per pool when not `<pool>-0..n-1` (a re-plan moves named replicas)."""

    def replica_ids(self, pool: PoolSpec) -> Sequence[str]:
        if self.ids is not None and pool.name in self.ids:
            return self.ids[pool.name]
        return replica_ids(pool)

    def strictness(self, pool: PoolSpec) -> float:
        classes = [self.slo_classes[c] for c in pool.slo_classes if c in self.slo_classes]
        return max((c.strictness() for c in classes), default=0.0)


def replica_ids(pool: PoolSpec) -> Sequence[str]:
    return [f"{pool.name}-{i}" for i in range(pool.replicas)]


def placement_from_json(doc: Mapping[str, Any]) -> ReplicaPlacement:
    """A gang placement back from `PlacementPlan.to_json` (only what a launch needs: the JSON has
    no `in_island`, which launching does not read)."""
    try:
        members = tuple(GangMember(node=str(m["node"]), gpus=tuple(int(g) for g in m["gpus"]),
                                   dp_rank_start=int(m["dp_rank_start"]), pp_stage=int(m.get("pp_stage", 0)),
                                   nic=None if m.get("nic") is None else str(m["nic"]))
                        for m in doc.get("members", ()))
        tier, role = str(doc["tier"]), str(doc["role"])
        if tier not in TIERS or role not in ROLES:
            raise ValueError(f"tier {tier!r} or role {role!r} is unknown")
        return ReplicaPlacement(replica_id=str(doc["replica_id"]), pool=str(doc["pool"]), role=role,
                                node=str(doc["node"]), gpus=tuple(int(g) for g in doc["gpus"]),
                                island=str(doc.get("island", "")), tier=tier, in_island=True,
                                members=members, in_domain=bool(doc.get("in_domain", True)),
                                expert_parallel=bool(doc.get("expert_parallel", False)))
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"placement {doc.get('replica_id', '?')}: not a plan placement ({err!r})") from None
