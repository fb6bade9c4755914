"""One simulated replica: the engine's own batching core (`pools.engine.core`) on a virtual clock,
with the router-side state the live router keeps about it (in flight, latency, last scrape)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from pools import catalog
from pools.costmodel import LOCAL, LinkCost
from pools.engine.core import DecodeRun, EngineConfig, EngineCore, StepResult
from pools.model import PlacementPlan, ReplicaPlacement
from pools.routing import ReplicaEndpoint
from router.decision import Candidate, ReplicaLoad
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
    latency_ms: float = 0.0
    scraped: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """running, waiting, KV usage as of the router's last scrape."""
    requests: set[str] = field(default_factory=set)

    @property
    def rid(self) -> str:
        return self.endpoint.replica_id

    def scrape(self) -> None:
        self.scraped = (float(self.core.num_running), float(self.core.num_waiting), self.core.kv_usage)

    def candidate(self) -> Candidate:
        running, waiting, kv = self.scraped
        return Candidate(self.endpoint, ReplicaLoad(running, waiting, kv, self.inflight, self.latency_ms, False))

    def observe_latency(self, ms: float) -> None:
        self.latency_ms = ms if self.latency_ms == 0 else 0.8 * self.latency_ms + 0.2 * ms


def build_replica(topology: Topology, plan: PlacementPlan, p: ReplicaPlacement, endpoint: ReplicaEndpoint,
                  max_num_seqs: int = 256, max_num_batched_tokens: int = 8192,
                  kv_capacity_tokens: int | None = None) -> SimReplica:
    pool = plan.pool(p.pool)
    gpu_name = topology.node(p.node).gpu(p.gpus[0]).model
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
                          kv_capacity_tokens=kv_capacity_tokens)
    if config.capacity() < config.block_size:
        raise ValueError(f"{p.replica_id}: {pool.model} at tp={pool.tp} leaves no room for KV cache on {gpu_name}")
    return SimReplica(endpoint=endpoint, placement=p, core=EngineCore(config), base_link=link)
