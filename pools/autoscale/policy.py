"""The autoscaling policy: from what the router and engines report per pool, how many replicas
each pool should have, and why.

Ray Serve's `autoscaling_config` vocabulary where it fits (`min_replicas`, `max_replicas`,
`target_ongoing_requests`, `upscale_delay_s`, `downscale_delay_s`, `upscaling_factor`,
`downscaling_factor`), plus the SLO signals Dynamo's planner scales on:

    load        desired = ceil(ongoing requests / target_ongoing_requests) (Ray Serve's rule),
                scaled by the factors, within [min_replicas, max_replicas]
    SLOs        a loaded prefill pool whose TTFT p99, or decode pool whose TPOT p99, is over
                `slo_headroom` of a class's target (each class against its own) wants at least
                one more replica; a pool within `slo_slack` of its targets with no queue may
                lose one
    sizing      the sizing model's prediction for the observed rate is a floor while the pool
                is over its SLO (it says how many, not only "more")
    delays      a change is made only after it has been wanted for `upscale_delay_s` (up) or
                `downscale_delay_s` (down) and not within `cooldown_s` of the pool's last one

Each decision says why, in words an operator reads in `isle status`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

Role = Literal["prefill", "decode", "mixed"]
QUEUE_SHARE = 0.5
"""A late p99 counts only while the pool is loaded (a queue, or more than this share of its
target in flight): a latency that more replicas cannot improve (the longest prompt's prefill,
one decode step's floor) must not grow the pool forever."""


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
    slo_headroom: float = 0.9
    """Over this share of a target: the pool is short."""
    slo_slack: float = 0.75
    """Under this share of every target, with no queue: the pool may shrink."""

    def __post_init__(self) -> None:
        problems = []
        if self.min_replicas < 0 or self.max_replicas < max(self.min_replicas, 1):
            problems.append(f"need 0 <= min_replicas ({self.min_replicas}) <= max_replicas ({self.max_replicas}), "
                            "max_replicas >= 1")
        if self.target_ongoing_requests <= 0:
            problems.append("target_ongoing_requests must be positive")
        if min(self.upscale_delay_s, self.downscale_delay_s, self.cooldown_s) < 0:
            problems.append("delays and cooldown are seconds >= 0")
        if self.upscaling_factor <= 0 or self.downscaling_factor <= 0:
            problems.append("scaling factors must be positive")
        if not 0 < self.slo_slack < self.slo_headroom <= 1.5:
            problems.append("need 0 < slo_slack < slo_headroom <= 1.5")
        if problems:
            raise ValueError("autoscaling: " + "; ".join(problems))


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassLatency:
    """One SLO class's tail latency on the pool over the window, next to its targets."""

    ttft_p99_ms: float | None = None
    tpot_p99_ms: float | None = None
    ttft_target_ms: float | None = None
    tpot_target_ms: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolObservation:
    """One pool as the router's metrics show it over the last window."""

    pool: str
    role: Role
    replicas: int
    """Serving now (starting ones count: they were decided already)."""
    running: float = 0.0
    waiting: float = 0.0
    request_rate: float = 0.0
    ttft_p99_ms: float | None = None
    tpot_p99_ms: float | None = None
    ttft_target_ms: float | None = None
    """With `ttft_p99_ms`: one latency for the whole pool against one target (the strictest)."""
    tpot_target_ms: float | None = None
    classes: Mapping[str, ClassLatency] = field(default_factory=dict)
    """Per SLO class: each class's p99 is judged against its own targets (preferred)."""
    predicted_replicas: int | None = None
    """What the sizing model says the observed rate needs (None: no prediction)."""

    @property
    def ongoing(self) -> float:
        return self.running + self.waiting


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


@dataclass(frozen=True, slots=True)
class AutoscalerState:
    pools: Mapping[str, PoolState] = field(default_factory=dict)


def desired(obs: PoolObservation, cfg: AutoscalingConfig) -> tuple[int, str]:
    """The replica count the pool should have now, and why."""
    n = max(obs.replicas, 1)
    by_load = math.ceil(obs.ongoing / cfg.target_ongoing_requests) if obs.ongoing > 0 else cfg.min_replicas
    if by_load > obs.replicas:
        by_load = obs.replicas + math.ceil((by_load - obs.replicas) * cfg.upscaling_factor)
    elif by_load < obs.replicas:
        by_load = obs.replicas - math.floor((obs.replicas - by_load) * cfg.downscaling_factor)
    reasons = [f"{obs.ongoing:g} requests in flight for {n} replicas (target {cfg.target_ongoing_requests:g} each)"]
    want = by_load
    late = _slo_ratio(obs)
    queued = obs.waiting > QUEUE_SHARE * cfg.target_ongoing_requests or \
        obs.ongoing > QUEUE_SHARE * cfg.target_ongoing_requests * n
    if late is not None and late > cfg.slo_headroom and queued:
        floor = max(obs.replicas + 1, obs.predicted_replicas or 0)
        want = max(want, floor)
        reasons.append(f"{_slo_text(obs)} is {late:.0%} of its target (over {cfg.slo_headroom:.0%})"
                       + (f"; sizing predicts {obs.predicted_replicas}" if obs.predicted_replicas else ""))
    elif want < obs.replicas and late is not None and late > cfg.slo_slack and queued:
        want = obs.replicas
        reasons.append(f"{_slo_text(obs)} at {late:.0%} of its target: not idle enough to shrink")
    elif want < obs.replicas and obs.waiting > QUEUE_SHARE * cfg.target_ongoing_requests:
        want = obs.replicas
        reasons.append(f"{obs.waiting:g} waiting: not shrinking under a queue")
    want = min(max(want, cfg.min_replicas), cfg.max_replicas)
    if want == cfg.max_replicas and by_load > cfg.max_replicas:
        reasons.append(f"capped at max_replicas {cfg.max_replicas}")
    return want, "; ".join(reasons)


def _slo_ratio(obs: PoolObservation) -> float | None:
    """The worst observed latency over its target for this pool's phase (per class when the
    observation has classes)."""
    latencies = list(obs.classes.values()) or [ClassLatency(
        ttft_p99_ms=obs.ttft_p99_ms, tpot_p99_ms=obs.tpot_p99_ms, ttft_target_ms=obs.ttft_target_ms,
        tpot_target_ms=obs.tpot_target_ms)]
    pairs = []
    for c in latencies:
        if obs.role in ("prefill", "mixed") and c.ttft_p99_ms is not None and c.ttft_target_ms:
            pairs.append(c.ttft_p99_ms / c.ttft_target_ms)
        if obs.role in ("decode", "mixed") and c.tpot_p99_ms is not None and c.tpot_target_ms:
            pairs.append(c.tpot_p99_ms / c.tpot_target_ms)
    return max(pairs) if pairs else None


def _slo_text(obs: PoolObservation) -> str:
    return "TTFT p99" if obs.role == "prefill" else "TPOT p99" if obs.role == "decode" else "latency p99"


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
        want, why = desired(obs, cfg)
        if want == obs.replicas:
            pools[name] = replace(mine, wanted=0)
            continue
        since = mine.since_s if mine.wanted and (mine.wanted > obs.replicas) == (want > obs.replicas) else now_s
        pools[name] = replace(mine, wanted=want, since_s=since)
        delay = cfg.upscale_delay_s if want > obs.replicas else cfg.downscale_delay_s
        if now_s - since < delay or now_s - mine.last_change_s < cfg.cooldown_s:
            continue
        actions.append(Action(pool=name, delta=want - obs.replicas, target=want,
                              reason=f"{'scale out' if want > obs.replicas else 'scale in'} {obs.replicas} -> "
                                     f"{want}: {why}"))
        pools[name] = PoolState(wanted=0, since_s=now_s, last_change_s=now_s)
    return actions, AutoscalerState(pools=pools)
