"""One simulated replica: the engine's own batching core (`simengine.core`) on a virtual clock,
with the router-side state the live router keeps about it (in flight, latency, last scrape)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from physics import catalog
from physics.costmodel import LOCAL, LinkCost
from physics.gang import GangCost
from pools.ganglinks import gang_cost
from pools.model import ExpertChoice, PlacementPlan, ReplicaPlacement
from pools.routing import ReplicaEndpoint, dp_ranks, rank_id, table_from_plan
from router.plugins.model import Candidate, ReplicaLoad
from simengine.core import EngineConfig, EngineCore, StepResult
from simengine.fastforward import DecodeRun
from topology import GpuRef, Topology, bottleneck


class Phase(enum.Enum):
    IDLE = 0
    STEP = 1
    """One `step()` in progress: its result is delivered when it ends."""
    RUN = 2
    """A fast-forwarded decode run in progress (cut short when a request arrives)."""
    WAIT = 3
    """Nothing runnable until a KV transfer lands (a START is scheduled for then)."""


@dataclass(slots=True, eq=False)
class SimReplica:
    endpoint: ReplicaEndpoint
    placement: ReplicaPlacement
    core: EngineCore
    base_link: LinkCost
    alive: bool = True
    phase: Phase = Phase.IDLE
    version: int = 0
    """Bumped when the event scheduled for this replica no longer stands."""
    pending: StepResult | None = None
    run: DecodeRun | None = None
    inflight: int = 0
    admitted: int = 0
    """Requests (or PD legs) sent to it so far: its pool's arrival rate (`loadtest.sim.autoscale`)."""
    latency_ms: float = 0.0
    scraped: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """running, waiting, KV usage as of the router's last scrape."""
    requests: set[str] = field(default_factory=set)
    nodes: frozenset[str] = frozenset()
    """Every node the replica's gang uses (losing any loses every rank)."""

    @property
    def rid(self) -> str:
        return self.endpoint.replica_id

    def scrape(self) -> None:
        self.scraped = (float(self.core.num_running), float(self.core.num_waiting), self.core.kv_usage)

    def candidate(self) -> Candidate:
        running, waiting, kv = self.scraped
        return Candidate(self.endpoint, ReplicaLoad(running, waiting, kv, self.inflight, self.latency_ms, False))

    def crossed_by(self, node: str, gpus: tuple[int, ...]) -> bool:
        """A link fault on `node` among `gpus` (all its GPUs when empty) is inside this TP group."""
        p = self.placement
        return p.node == node and len(p.gpus) > 1 and (not gpus or set(gpus) <= set(p.gpus))

    def degrade(self, factor: float) -> None:
        """The TP group's link carries `factor` of its bandwidth, its latency grows by the inverse."""
        self.core.link = LinkCost(bandwidth_gb_s=self.base_link.bandwidth_gb_s * factor,
                                  latency_us=self.base_link.latency_us / max(factor, 1e-6), hw=self.base_link.hw,
                                  switched=self.base_link.switched)

    def restore(self) -> None:
        self.core.link = self.base_link
        self.endpoint = replace(self.endpoint, health_score=1.0, draining=False)

    def observe_latency(self, ms: float) -> None:
        self.latency_ms = ms if self.latency_ms == 0 else 0.8 * self.latency_ms + 0.2 * ms


def rank_view(p: ReplicaPlacement, endpoint: ReplicaEndpoint) -> ReplicaPlacement:
    """One data-parallel rank of a gang as a placement of its own (its TP group's GPUs)."""
    if not endpoint.gang:
        return p
    gpus = [(m.node, m.gpus) for m in p.members if m.dp_rank_start == endpoint.dp_rank and m.pp_stage == 0]
    first, rest = gpus[0], gpus[1:]
    return replace(p, replica_id=endpoint.replica_id, node=first[0], gpus=first[1], members=(),
                   extra_nodes=tuple(rest), in_domain=True)


def _slowest_gpu(topology: Topology, p: ReplicaPlacement) -> str | None:
    """A gang's ranks step in lockstep (every MoE layer is a barrier): each runs at its slowest
    GPU's pace."""
    names = {topology.node(n).gpu(g).model for n, g in p.gpu_refs()}
    known = [catalog.gpu(n) for n in names if n is not None and n in catalog.gpus()]
    if len(known) != len(names):
        return None
    return min(known, key=lambda g: (g.hbm_gb_s, g.bf16_tflops, g.name)).name


def build_replica(topology: Topology, plan: PlacementPlan, p: ReplicaPlacement, endpoint: ReplicaEndpoint,
                  max_num_seqs: int = 256, max_num_batched_tokens: int = 8192,
                  kv_capacity_tokens: int | None = None, gang: GangCost | None = None,
                  prefix_caching: bool = False) -> SimReplica:
    """The engine for `endpoint`: the replica `p`, or one data-parallel rank of the gang `p` (its
    steps priced as the gang's, `gang` or `pools.ganglinks.gang_cost`)."""
    pool = plan.pool(p.pool)
    gang = gang or gang_cost(topology, plan, p)
    nodes = frozenset(n for n, _ in p.gpu_refs())
    slowest = _slowest_gpu(topology, p) if gang is not None else None
    p = rank_view(p, endpoint)
    gpu_name = slowest or topology.node(p.node).gpu(p.gpus[0]).model
    if pool.model is None or pool.model not in catalog.models():
        raise ValueError(f"pool {pool.name}: the simulator needs a catalogue model (got {pool.model!r}; known: "
                         f"{', '.join(sorted(catalog.models()))})")
    if gpu_name is None or gpu_name not in catalog.gpus():
        raise ValueError(f"{p.node} GPU {p.gpus[0]}: the simulator needs a catalogue GPU model (got {gpu_name!r}; "
                         f"known: {', '.join(sorted(catalog.gpus()))})")
    refs = [GpuRef(p.node, g) for g in p.gpus] + [GpuRef(n, g) for n, gs in p.extra_nodes for g in gs]
    link = LinkCost.of(bottleneck(topology, refs)) if len(refs) > 1 else LOCAL
    config = EngineConfig(model=catalog.model(pool.model), gpu=catalog.gpu(gpu_name), tp=pool.tp, link=link,
                          max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                          kv_capacity_tokens=kv_capacity_tokens, gang=gang, prefix_caching=prefix_caching)
    if config.capacity() < config.block_size:
        raise ValueError(f"{p.replica_id}: {pool.model} at tp={pool.tp} leaves no room for KV cache on {gpu_name}")
    return SimReplica(endpoint=endpoint, placement=p, core=EngineCore(config), base_link=link, nodes=nodes)


def build_replicas(topology: Topology, plan: PlacementPlan, max_num_seqs: int = 256,
                   kv_capacity_tokens: int | None = None, experts: ExpertChoice | None = None,
                   prefix_caching: bool = False) -> dict[str, SimReplica]:
    """Every placed replica of the plan, with the routing table's endpoint the live router would
    have for it (`pools.routing.table_from_plan`); each gang's cost once (with `experts`, its
    expert map's load imbalance and cross-domain share)."""
    gangs = {p.replica_id: gang_cost(topology, plan, p, experts=experts) for p in plan.placements if p.members}
    served = {p.name: p.model or p.name for p in plan.pools}
    urls = {p.replica_id: f"sim://{p.replica_id}" for p in plan.placements}
    urls.update({rank_id(p.replica_id, k): f"sim://{rank_id(p.replica_id, k)}" for p in plan.placements
                 if p.members and plan.pool(p.pool).dp > 1 for k, _ in dp_ranks(p)})
    gpu_models = {p.replica_id: topology.node(p.node).gpu(p.gpus[0]).model for p in plan.placements}
    table = table_from_plan(plan, urls, served, gpu_models=gpu_models)
    by_id = {p.replica_id: p for p in plan.placements}
    return {e.replica_id: build_replica(topology, plan, by_id[e.gang or e.replica_id], e, max_num_seqs,
                                        kv_capacity_tokens=kv_capacity_tokens, gang=gangs.get(e.gang or e.replica_id),
                                        prefix_caching=prefix_caching)
            for e in table.replicas}
