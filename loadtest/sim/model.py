"""The simulator's inputs and outputs: the deployment and its settings (`SimConfig`), faults on a
timeline, the result of a run, and the state it keeps per request."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from loadtest.model import OK, RequestResult, TraceRequest
from pools.autoscale.policy import AutoscalingConfig
from pools.model import ExpertChoice, PlacementPlan, SLOClass
from router.plugins.model import Candidate, RouteRequest
from router.plugins.pd import PDDecision, pd_decide
from router.plugins.profile import Profile
from router.plugins.pull import Pull
from topology import Topology

ARRIVAL, START, STEP_END, RUN_END, NET, KV_READY, SCRAPE, FAULT, DRAIN, AUTOSCALE, READY = range(11)
"""The simulator's event kinds (`loadtest.sim.cluster` indexes its handlers by them)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Fault:
    at_s: float
    kind: str
    """link_degrade | link_restore | node_loss | kv_transport_fallback | kv_remote_nic | kv_restore"""
    node: str = ""
    gpus: tuple[int, ...] = ()
    """The link's two GPUs (link faults); empty: every link of the node."""
    factor: float = 0.25
    """Bandwidth left on a degraded link (latency grows by the inverse); kv_remote_nic: the KV
    rate left (0.5: the NIC on the other socket)."""
    pair: tuple[str, ...] = ()
    """kv_* faults: the (prefill, decode) replicas whose KV transfers it changes
    (`loadtest.sim.kvfaults`)."""


class PDChoice:
    """How the simulated router chooses PD or a mixed replica: `router.decision.pd_decide`'s
    signature (a baseline rule can stand in for it: tests compare against always splitting)."""

    def __call__(self, req: RouteRequest, snapshot: Sequence[Candidate], topology: Topology | None, *,
                 min_prompt_tokens: int, has_mixed: bool) -> PDDecision | None:
        return pd_decide(req, snapshot, topology, min_prompt_tokens=min_prompt_tokens, has_mixed=has_mixed)


@dataclass(frozen=True, slots=True, kw_only=True)
class AutoscaleSettings:
    """An autoscaler in the simulator: the policy (`pools.autoscale.policy`) per pool, and where
    new replicas go: `topology` places them with the run's placement policy (island-aligned in
    the shipped scenario) and removes the costliest first, `blind` places with first-fit and
    removes the newest first (the same policy, no topology)."""

    kind: str
    configs: Mapping[str, AutoscalingConfig]
    interval_s: float = 5.0
    startup_s: float = 30.0
    """From a scale-out decision to the replica serving (weights load, engine start)."""
    window_s: float = 30.0
    """The latency percentiles the policy sees cover requests that ended this recently."""
    look_back_s: float = 30.0
    """Load and arrival rate are averaged over this long (Ray Serve's `look_back_period_s`)."""

    def __post_init__(self) -> None:
        if self.kind not in ("topology", "blind"):
            raise ValueError(f"autoscaler {self.kind!r}: topology or blind")
        if self.interval_s <= 0 or self.startup_s < 0 or self.window_s <= 0 or self.look_back_s <= 0:
            raise ValueError("autoscaler: interval_s, window_s and look_back_s > 0, startup_s >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    topology: Topology
    plan: PlacementPlan
    classes: Mapping[str, SLOClass]
    profiles: Mapping[str, Profile] = field(default_factory=dict)
    """Routing profile per SLO class (the default profile for the others)."""
    pd_enabled: bool = True
    pd_min_prompt_tokens: int = 256
    pd_choice: PDChoice = field(default_factory=PDChoice)
    """The PD-or-mixed rule (the router's own unless a comparison replaces it)."""
    scrape_interval_s: float = 0.5
    detect_s: float = 2.0
    """How long the health loop takes to notice a degraded link and drain the replica."""
    retries: int = 2
    faults: tuple[Fault, ...] = ()
    seed: int = 0
    max_itl_samples: int = 16
    max_num_seqs: int = 256
    kv_capacity_tokens: int | None = None
    """Every replica's KV cache (None: from the cost model)."""
    fast_forward: bool = True
    model: str | None = None
    """The served model every request asks for (default: the first, by name)."""
    experts: ExpertChoice | None = None
    """How EP gangs map their experts (None: spread uniformly; `pools.experts`)."""
    autoscale: AutoscaleSettings | None = None
    """Pools that follow the load (`loadtest.sim.autoscale`); None: the plan's counts throughout."""
    prefix_caching: bool = False
    """Every engine keeps a prefix cache (`kvblocks.cache`) over the requests' token ids
    (`loadtest.sim.tokens`)."""
    kv_index: bool = False
    """The router knows what each engine's prefix cache holds (its KV events; here read from the
    engines directly, without the events' few milliseconds of lag): `RouteRequest.cached`."""


@dataclass(slots=True, eq=False)
class _Req:
    trace: TraceRequest
    rid: str
    cls: SLOClass
    route: RouteRequest
    replica: str = ""
    prefill: str = ""
    phase: str = "new"
    """new | prefill | transfer | decode | done"""
    tier: str = ""
    first_s: float | None = None
    last_s: float = 0.0
    itls: list[float] = field(default_factory=list)
    kv_latency_s: float = 0.0
    retries: int = 0
    pd: PDDecision | None = None
    tokens: tuple[int, ...] = ()
    """The prompt's token ids (with prefix caching)."""
    keys: list[int] = field(default_factory=list)
    """Its full blocks' keys (with a KV index)."""
    pull: Pull | None = None


@dataclass(slots=True)
class SimResult:
    results: list[RequestResult]
    duration_s: float
    events: int
    log: list[dict[str, Any]]
    """Faults, drains, re-routes and scale events, with their virtual times."""
    gpu_hours: float = 0.0
    """GPUs held (placed, starting or draining) integrated over the run."""
    prefix: dict[str, int] = field(default_factory=dict)
    """With prefix caching, the engines' own counts over the run (vLLM's
    `vllm:prefix_cache_queries` / `_hits`, tokens): `queries`, `hits`, and `pulled` (tokens read
    from a peer's cache)."""
    timeline: list[dict[str, Any]] = field(default_factory=list)
    """With an autoscaler: at each of its ticks, per pool, replicas in the plan and serving, and
    GPUs held (`{"t", "pool", "replicas", "serving", "gpus"}`)."""


def result_of(req: _Req, t: float, outcome: str) -> RequestResult:
    """What the load client records for a request that ended at `t` with `outcome`."""
    tr = req.trace
    ok = outcome == OK
    ttft = req.first_s - tr.arrival_s if ok and req.first_s is not None else None
    out = tr.output_tokens if ok else 0
    tpot = (t - req.first_s) / (out - 1) if ok and req.first_s is not None and out > 1 else None
    return RequestResult(
        index=tr.index, slo_class=tr.slo_class, sent_s=tr.arrival_s, outcome=outcome,
        prompt_tokens=tr.prompt_tokens, output_tokens=out, ttft_s=ttft, tpot_s=tpot,
        itls_s=tuple(req.itls) if ok else (), e2e_s=t - tr.arrival_s if ok else None, tier=req.tier,
        replica=req.replica, prefill_replica=req.prefill)
