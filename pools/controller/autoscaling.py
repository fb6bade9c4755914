"""The live autoscaler: the router's load reports in (`observe`, every second), a decision every
`interval_s` on the controller's health loop (`decide`: the pure policy of
`pools.autoscale.policy` on observations from `pools.autoscale.observe`, with the sizing model's
capacity from `pools.autoscale.predict`), and what operators read (`status`: each pool's counts,
what the autoscaler saw, and its last decisions with their reasons). The controller acts on the
decisions (`act`) with the start and drain code re-placement uses: a new replica is a move's
replacement with nothing to replace (started on a worker thread, installed and published once
up); a removed one leaves the plan and the table at once, finishes what it serves and stops once
idle. Nothing here blocks: a decision is arithmetic on what the reports said.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from pools.autoscale.actions import grow, shrink
from pools.autoscale.observe import Window, parse_report
from pools.autoscale.policy import Action, AutoscalerState, PoolObservation, on_tick
from pools.autoscale.predict import replica_capacity
from pools.controller.fleet import Fleet, Running
from pools.controller.rollout import Change
from pools.controller.spec import AutoscaleSpec, ControllerSpec
from pools.model import PlacementPlan, SLOClass
from pools.routing import RoutingTable
from topology import Topology

log = logging.getLogger("isleserve.controller")
DECISIONS_KEPT = 20
STALE_S = 10.0
"""Without a report this recent the autoscaler does not decide: it would act on nothing."""
IDLE_GRACE_S = 3.0
"""A scaled-in replica is not taken for idle this soon: the routers follow the table every second
and may still send it the request they had already chosen it for."""


class Autoscaling:
    def __init__(self, spec: AutoscaleSpec, clock: Callable[[], float]) -> None:
        self.spec, self.clock = spec, clock
        self.window = Window(max(spec.look_back_s, spec.window_s) + 2 * spec.interval_s)
        self.state = AutoscalerState()
        self.due_s = clock() + spec.interval_s
        self.seen: dict[str, PoolObservation] = {}
        self.wanted: dict[str, int] = {}
        self.decisions: deque[dict[str, Any]] = deque(maxlen=DECISIONS_KEPT)
        self.acted: Counter[tuple[str, str]] = Counter()
        self.reports = 0

    @property
    def enabled(self) -> bool:
        return bool(self.spec.pools)

    def observe(self, doc: Any) -> None:
        """A router's load report (ValueError: not one)."""
        self.window.add(parse_report(doc, self.clock()))
        self.reports += 1

    def due(self) -> bool:
        now = self.clock()
        if not self.enabled or now < self.due_s:
            return False
        self.due_s = now + self.spec.interval_s
        last = self.window.reports[-1].at_s if self.window.reports else None
        if last is None or now - last > STALE_S:
            since = "ever" if last is None else f"{now - last:.0f} s"
            log.info("autoscaling: no load report for %s; no decision", since)
            return False
        return True

    def decide(self, plan: PlacementPlan, topology: Topology, serving: Mapping[str, int],
               classes: Mapping[str, SLOClass]) -> list[Action]:
        """One tick of the policy over every autoscaled pool: the actions to take now."""
        now = self.clock()
        observations = {name: self._observation(now, name, plan, topology, serving.get(name, 0), classes)
                        for name in self.spec.pools if any(p.name == name for p in plan.pools)}
        actions, self.state = on_tick(now, observations, self.spec.pools, self.state)
        self.seen = observations
        targets = {a.pool: a.target for a in actions}  # acted on: the count it goes to
        self.wanted = {name: targets[name] if name in targets else s.wanted or observations[name].replicas
                       for name, s in self.state.pools.items() if name in observations}
        for a in actions:
            log.info("autoscaling %s: %s", a.pool, a.reason)
        return actions

    def _observation(self, now: float, name: str, plan: PlacementPlan, topology: Topology, serving: int,
                     classes: Mapping[str, SLOClass]) -> PoolObservation:
        spec, cfg = plan.pool(name), self.spec.pools[name]
        mine = [classes[c] for c in spec.slo_classes if c in classes] or list(classes.values())
        latency_pools = [p.name for p in plan.pools if p.model == spec.model and p.role != "prefill"] \
            if spec.role == "prefill" else [name]
        capacity = None if cfg.sizing_slo_share is None else replica_capacity(
            spec, topology, mine, self.spec.prompt_tokens, self.spec.output_tokens, cfg.sizing_slo_share)
        return self.window.observe(now, name, spec.role, sum(1 for p in plan.placements if p.pool == name), serving,
                                   mine, cfg.slo_percentile, self.spec.look_back_s, self.spec.window_s,
                                   latency_pools, capacity)

    def record(self, action: Action, result: Mapping[str, Any]) -> dict[str, Any]:
        """An action taken: kept for `status` (and returned, for the controller's event)."""
        entry = {"time": round(self.clock(), 3), "pool": action.pool, "delta": action.delta, "target": action.target,
                 "reason": action.reason, **result}
        self.decisions.append(entry)
        self.acted[(action.pool, "out" if action.delta > 0 else "in")] += 1
        return entry

    def status(self, plan: PlacementPlan | None, serving: Mapping[str, int]) -> dict[str, Any]:
        """What `isle status` and the router's `isle_autoscale_*` metrics show."""
        pools: dict[str, Any] = {}
        for name, cfg in sorted(self.spec.pools.items()):
            seen = self.seen.get(name)
            bound = self.state.pools[name].capacity_bound_rps if name in self.state.pools else None
            placed = sum(1 for p in plan.placements if p.pool == name) if plan is not None else None
            capacity = [c for c in (seen.capacity_rps if seen else None, bound) if c is not None]
            pools[name] = {
                "min": cfg.min_replicas, "max": cfg.max_replicas, "placed": placed, "serving": serving.get(name, 0),
                "wanted": self.wanted.get(name, placed),
                "request_rate": round(seen.request_rate, 3) if seen else 0.0,
                "in_flight": round(seen.ongoing, 2) if seen else 0.0,
                "capacity_rps": round(min(capacity), 3) if capacity else None,
                "capacity_bound_rps": None if bound is None else round(bound, 3),
                "scaled_out": self.acted[(name, "out")], "scaled_in": self.acted[(name, "in")]}
        now = self.clock()
        return {"pools": pools, "reports": self.reports, "interval_s": self.spec.interval_s,
                "decisions": [{**d, "ago_s": round(now - d["time"], 1)} for d in self.decisions]}


class Core(Protocol):
    """What acting needs of the controller (`pools.controller.controller.ControllerCore` is one)."""

    spec: ControllerSpec
    clock: Callable[[], float]
    plan: PlacementPlan | None
    topology: Topology | None
    table: RoutingTable
    fleet: Fleet
    autoscaling: Autoscaling

    @property
    def running(self) -> dict[str, Running]: ...
    @property
    def retiring(self) -> list[Running]: ...
    def _record(self, kind: str, payload: dict[str, Any]) -> None: ...
    def _apply(self, c: Change) -> None: ...


def serving_counts(core: Core) -> dict[str, int]:
    """Per pool, the replicas taking traffic (installed, not draining)."""
    counts: dict[str, int] = {}
    for r in core.running.values():
        if not r.draining:
            counts[r.placement.pool] = counts.get(r.placement.pool, 0) + 1
    return counts


def act(core: Core) -> bool:
    """One decision, acted on; True when it changed what runs (the table is published then)."""
    assert core.plan is not None and core.topology is not None
    actions = core.autoscaling.decide(core.plan, core.topology, serving_counts(core), core.spec.slo_classes)
    for a in actions:
        if a.delta > 0:
            _scale_out(core, a)
        else:
            _scale_in(core, a)
    return bool(actions)


def _scale_out(core: Core, a: Action) -> None:
    """New replicas on the GPUs nobody holds, placed by the deployment's placement policy."""
    assert core.plan is not None and core.topology is not None
    core.plan, placed, missing = grow(core.plan, core.topology, a.pool, a.delta, core.spec.policy,
                                      [r.placement for r in core.retiring])
    core._record("autoscale", core.autoscaling.record(a, {"missing": missing, "placed": [
        {"replica_id": p.replica_id, "node": p.node, "gpus": list(p.gpus), "tier": p.tier} for p in placed]}))
    for p in placed:
        core._apply(Change(replica_id=p.replica_id, order="start", old=None, new=p, reason=a.reason))


def _scale_in(core: Core, a: Action) -> None:
    """The replicas whose removal costs least (`pools.autoscale.actions.removal_order`) leave the
    plan and the table; a start still in flight for one is dropped."""
    assert core.plan is not None
    health = {r.replica_id: r.health_score for r in core.table.replicas}
    core.plan, gone = shrink(core.plan, a.pool, -a.delta, core.autoscaling.window.inflight(), health)
    now = core.clock()
    for rid in gone:
        core.fleet.starts.drop(rid, f"scaled in: {a.reason}")
        r = core.running.pop(rid, None)
        if r is not None:
            r.draining, r.idle_from = True, now + IDLE_GRACE_S
            r.retire_by = now + core.spec.autoscale.drain_timeout_s
            core.retiring.append(r)
    core._record("autoscale", core.autoscaling.record(a, {"removed": gone}))
