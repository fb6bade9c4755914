"""The autoscaling policy: from what the router and engines report per pool, how many replicas
each pool should have, and why.

Ray Serve's `autoscaling_config` vocabulary where it fits (`min_replicas`, `max_replicas`,
`target_ongoing_requests`, `upscale_delay_s`, `downscale_delay_s`, `upscaling_factor`,
`downscaling_factor`), plus the SLO signals Dynamo's planner scales on:

    load        desired = ceil(ongoing requests / target_ongoing_requests) (Ray Serve's rule; the
                adapter averages the load over its look-back period, as Ray Serve does)
    prediction  desired >= ceil(request rate / one replica's capacity at the SLO targets), the
                capacity coming from the sizing model (`pools.autoscale.predict`): Dynamo's SLA
                planner sizes each phase this way. It reacts to a load step as soon as the
                rate shows it, before a queue forms, and keeps a pool from shrinking below what
                its rate needs
    learning    the sizing model prices the mean request; the pool's own tail says what one
                replica really carries. When a loaded pool whose replicas all serve misses its
                targets, the rate per replica it was carrying becomes a bound on the capacity
                (as Dynamo's planner corrects its model by observed latency); the bound doubles
                back towards the model every BOUND_DOUBLING_S, so it settles where the pool
                starts missing
    SLOs        a loaded prefill pool whose TTFT, or decode pool whose TPOT, at `slo_percentile`
                (p95: what 95 % of requests meet) is over `slo_headroom` of a class's target
                (each class against its own) wants one more replica, once every replica it has
                serves (one still starting would be asked for again and again); a loaded pool
                over `slo_slack` of its targets may not shrink
    factors     a change moves `upscaling_factor` / `downscaling_factor` of the way to the
                target (at least one replica), within [min_replicas, max_replicas]
    delays      a change is made only after it has been wanted for `upscale_delay_s` (up) or
                `downscale_delay_s` (down) and not within `cooldown_s` of the pool's last one;
                scale-in goes to the most replicas any tick of its delay wanted (Kubernetes
                HPA's scale-down stabilization window: a lull in the delay does not decide)

Each decision says why, in words an operator reads in `isle status`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

Role = Literal["prefill", "decode", "mixed"]
QUEUE_SHARE = 0.5
"""A late tail counts only while the pool is loaded (a queue, or more than this share of its
target in flight): a latency that more replicas cannot improve (the longest prompt's prefill,
one decode step's floor) must not grow the pool forever."""
BOUND_DOUBLING_S = 300.0
"""The learned capacity bound doubles back towards the sizing model's figure this often."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AutoscalingConfig:
    min_replicas: int = 1
    max_replicas: int = 8
    target_ongoing_requests: float = 32.0
    """Requests in flight (running + waiting) per replica the pool aims at (Ray Serve's knob)."""
    upscale_delay_s: float = 10.0
    downscale_delay_s: float = 60.0
    cooldown_s: float = 10.0
    upscaling_factor: float = 1.0
    downscaling_factor: float = 1.0
    slo_percentile: float = 95.0
    """The tail latency judged against the targets: the share of requests that should meet them
    (p95: 95 % of a class's requests within its TTFT or TPOT target)."""
    slo_headroom: float = 0.9
    """Over this share of a target: the pool is short."""
    slo_slack: float = 0.75
    """Under this share of every target, with no queue: the pool may shrink."""
    sizing_slo_share: float | None = 0.8
    """The sizing model's capacity per replica is taken at this share of the targets (its mean
    request within it leaves the tail the rest); None: no prediction (`pools.autoscale.predict`)."""

    def __post_init__(self) -> None:
        problems = []
        if self.min_replicas < 1 or self.max_replicas < self.min_replicas:
            problems.append(f"need 1 <= min_replicas ({self.min_replicas}) <= max_replicas ({self.max_replicas}) "
                            "(a pool at 0 would see no requests to scale back up from)")
        if self.target_ongoing_requests <= 0:
            problems.append("target_ongoing_requests must be positive")
        if min(self.upscale_delay_s, self.downscale_delay_s, self.cooldown_s) < 0:
            problems.append("delays and cooldown are seconds >= 0")
        if self.upscaling_factor <= 0 or self.downscaling_factor <= 0:
            problems.append("scaling factors must be positive")
        if not 50 <= self.slo_percentile < 100:
            problems.append("slo_percentile must be in [50, 100)")
        if not 0 < self.slo_slack < self.slo_headroom <= 1.5:
            problems.append("need 0 < slo_slack < slo_headroom <= 1.5")
        if self.sizing_slo_share is not None and not 0 < self.sizing_slo_share <= 1.5:
            problems.append("sizing_slo_share must be in (0, 1.5] (or null: no prediction)")
        if problems:
            raise ValueError("autoscaling: " + "; ".join(problems))


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassLatency:
    """One SLO class's tail latency on the pool over the window (at the config's
    `slo_percentile`), next to its targets."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    ttft_target_ms: float | None = None
    tpot_target_ms: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolObservation:
    """One pool as the router's metrics show it over the last window."""

    pool: str
    role: Role
    replicas: int
    """In the plan (starting ones count: they were decided already)."""
    serving: int | None = None
    """Of those, taking traffic now (None: all of them)."""
    running: float = 0.0
    waiting: float = 0.0
    request_rate: float = 0.0
    """Requests per second sent to the pool over the look-back period."""
    classes: Mapping[str, ClassLatency] = field(default_factory=dict)
    """Per SLO class: each class's tail latency is judged against its own targets."""
    capacity_rps: float | None = None
    """Requests per second one replica serves within the SLO targets (the sizing model's; None:
    no prediction, the load and SLO rules alone)."""

    @property
    def ongoing(self) -> float:
        return self.running + self.waiting

    @property
    def per_replica_rps(self) -> float | None:
        """The rate each serving replica carries (None: some are still starting, or none serve)."""
        serving = self.replicas if self.serving is None else self.serving
        return self.request_rate / serving if serving == self.replicas and serving > 0 else None


@dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    pool: str
    delta: int
    """Replicas to add (> 0) or remove (< 0)."""
    target: int
    reason: str


@dataclass(frozen=True, slots=True)
class PoolState:
    wanted: int = 0
    """The target the pool wanted last tick (0: none pending)."""
    since_s: float = 0.0
    """When it started wanting it."""
    last_change_s: float = -math.inf
    capacity_bound_rps: float | None = None
    """What the pool's own latencies say one replica carries at most (module docstring)."""
    learned_at_s: float = 0.0


@dataclass(frozen=True, slots=True)
class AutoscalerState:
    pools: Mapping[str, PoolState] = field(default_factory=dict)


def desired(obs: PoolObservation, cfg: AutoscalingConfig, capacity_bound_rps: float | None = None
            ) -> tuple[int, str]:
    """The replica count the pool should have now, and why."""
    n = obs.replicas
    want = math.ceil(obs.ongoing / cfg.target_ongoing_requests - 1e-9) if obs.ongoing > 0 else cfg.min_replicas
    reasons = [f"{obs.ongoing:.3g} requests in flight for {n} replicas (target {cfg.target_ongoing_requests:g} each)"]
    capacity = _capacity(obs.capacity_rps, capacity_bound_rps)
    if capacity is not None:
        predicted = math.ceil(obs.request_rate / capacity - 1e-9)
        learned = capacity_bound_rps is not None and capacity == capacity_bound_rps
        reasons.append(f"{obs.request_rate:.3g} req/s needs {predicted} at {capacity:.3g} req/s each"
                       + (" (as the pool's latency showed)" if learned else ""))
        want = max(want, predicted)
    late = _slo_ratio(obs)
    starting = obs.serving is not None and obs.serving < n  # what was added is not serving yet
    if late is not None and late > cfg.slo_headroom and _loaded(obs, cfg) and not starting:
        want = max(want, n + 1)
        reasons.append(f"{_slo_text(obs, cfg)} is {late:.0%} of its target (over {cfg.slo_headroom:.0%})")
    elif want < n and late is not None and late > cfg.slo_slack and _loaded(obs, cfg, want):
        want = n
        reasons.append(f"{_slo_text(obs, cfg)} at {late:.0%} of its target: not idle enough to shrink")
    elif want < n and obs.waiting > QUEUE_SHARE * cfg.target_ongoing_requests:
        want = n
        reasons.append(f"{obs.waiting:.3g} waiting: not shrinking under a queue")
    if want > n:
        want = n + max(1, math.ceil((want - n) * cfg.upscaling_factor - 1e-9))
    elif want < n:
        want = n - max(1, math.floor((n - want) * cfg.downscaling_factor + 1e-9))
    capped = min(max(want, cfg.min_replicas), cfg.max_replicas)
    if capped < want:
        reasons.append(f"capped at max_replicas {cfg.max_replicas}")
    return capped, "; ".join(reasons)


def _capacity(model_rps: float | None, bound_rps: float | None) -> float | None:
    found = [c for c in (model_rps, bound_rps) if c is not None and c > 0]
    return min(found) if found else None


def _loaded(obs: PoolObservation, cfg: AutoscalingConfig, replicas: int | None = None) -> bool:
    """A queue, or more than QUEUE_SHARE of the target in flight per replica (of `replicas`: the
    count it would have after shrinking)."""
    count = max(obs.replicas if replicas is None else replicas, 1)
    return obs.waiting > QUEUE_SHARE * cfg.target_ongoing_requests or \
        obs.ongoing > QUEUE_SHARE * cfg.target_ongoing_requests * count


def learn(obs: PoolObservation, cfg: AutoscalingConfig, bound_rps: float | None, elapsed_s: float
          ) -> float | None:
    """The capacity bound after this observation (module docstring: learning), `elapsed_s` after
    the last one: lowered to the rate per replica at which a loaded pool missed its targets, and
    otherwise relaxed towards the sizing model (doubling every BOUND_DOUBLING_S), so one bad
    window does not keep the pool large for good."""
    rate, late = obs.per_replica_rps, _slo_ratio(obs)
    if rate is not None and rate > 0 and late is not None and late > cfg.slo_headroom and _loaded(obs, cfg):
        return rate if bound_rps is None else min(bound_rps, rate)
    if bound_rps is None:
        return None
    relaxed = bound_rps * 2.0 ** (max(elapsed_s, 0.0) / BOUND_DOUBLING_S)
    return None if obs.capacity_rps is not None and relaxed >= obs.capacity_rps else relaxed


def _slo_ratio(obs: PoolObservation) -> float | None:
    """The worst observed tail latency over its target for this pool's phase, over the classes."""
    pairs = []
    for c in obs.classes.values():
        if obs.role in ("prefill", "mixed") and c.ttft_ms is not None and c.ttft_target_ms:
            pairs.append(c.ttft_ms / c.ttft_target_ms)
        if obs.role in ("decode", "mixed") and c.tpot_ms is not None and c.tpot_target_ms:
            pairs.append(c.tpot_ms / c.tpot_target_ms)
    return max(pairs) if pairs else None


def _slo_text(obs: PoolObservation, cfg: AutoscalingConfig) -> str:
    what = "TTFT" if obs.role == "prefill" else "TPOT" if obs.role == "decode" else "latency"
    return f"{what} p{cfg.slo_percentile:g}"


def on_tick(now_s: float, observations: Mapping[str, PoolObservation], configs: Mapping[str, AutoscalingConfig],
            state: AutoscalerState) -> tuple[list[Action], AutoscalerState]:
    """One tick: the actions to take now (each with its reason) and the state for the next tick.
    Pools without a config are left alone."""
    actions: list[Action] = []
    pools = dict(state.pools)
    for name, obs in sorted(observations.items()):
        cfg = configs.get(name)
        if cfg is None:
            continue
        mine = pools.get(name, PoolState())
        if cfg.sizing_slo_share is not None:
            bound = learn(obs, cfg, mine.capacity_bound_rps, now_s - mine.learned_at_s)
            mine = replace(mine, capacity_bound_rps=bound, learned_at_s=now_s)
        want, why = desired(obs, cfg, mine.capacity_bound_rps)
        if want == obs.replicas:
            pools[name] = replace(mine, wanted=0)
            continue
        up = want > obs.replicas
        same = mine.wanted and (mine.wanted > obs.replicas) == up
        since = mine.since_s if same else now_s
        if same and not up:  # scale in to the most any tick of the delay wanted (HPA's stabilization window)
            want = max(want, mine.wanted)
            if want >= obs.replicas:  # the count moved under it (a lost node): nothing left to remove
                pools[name] = replace(mine, wanted=0)
                continue
        pools[name] = replace(mine, wanted=want, since_s=since)
        delay = cfg.upscale_delay_s if up else cfg.downscale_delay_s
        if now_s - since < delay or now_s - mine.last_change_s < cfg.cooldown_s:
            continue
        actions.append(Action(pool=name, delta=want - obs.replicas, target=want,
                              reason=f"{'scale out' if up else 'scale in'} {obs.replicas} -> {want}: {why}"))
        pools[name] = replace(mine, wanted=0, since_s=now_s, last_change_s=now_s)
    return actions, AutoscalerState(pools=pools)
