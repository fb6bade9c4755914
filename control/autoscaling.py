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
import threading
from collections import Counter, deque
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from control.fleet import Fleet, Running
from control.spec import AutoscaleSpec, ControllerSpec
from pools.autoscale.actions import grow, shrink, with_count
from pools.autoscale.observe import Window, parse_report
from pools.autoscale.policy import Action, AutoscalerState, PoolObservation, on_tick
from pools.autoscale.predict import replica_capacity
from pools.model import PlacementPlan, ReplicaPlacement, SLOClass
from pools.placement.rollout import Change
from pools.routing import RoutingTable
from topology import Topology

log = logging.getLogger("isleserve.controller")
DECISIONS_KEPT = 20
STALE_S = 10.0
REPORTS_PER_S = 4.0
REPORT_BURST = 8.0
"""Load reports taken per second (a router sends one a second), and the burst allowed: more
are refused, so a flood of reports (forged or from a broken router) cannot steer the window."""
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
        self.refused = 0
        self._allowance, self._allowance_at = REPORT_BURST, clock()
        self.lock = threading.Lock()
        """Reports come in on the actor's call threads, without the controller's lock (a health
        pass that stops replicas must not hold up the router); decisions and views take this."""

    @property
    def enabled(self) -> bool:
        return bool(self.spec.pools)

    def observe(self, doc: Any) -> None:
        """A router's load report, timed as it arrives. ValueError: not one (pools.autoscale.observe
        checks every figure), or reports come faster than REPORTS_PER_S (beyond REPORT_BURST)."""
        now = self.clock()
        with self.lock:
            self._allowance = min(REPORT_BURST, self._allowance + (now - self._allowance_at) * REPORTS_PER_S)
            self._allowance_at = now
            if self._allowance < 1.0:
                self.refused += 1
                raise ValueError(f"load reports arrive faster than {REPORTS_PER_S:g} a second; this one is dropped")
            self._allowance -= 1.0
        try:
            report = parse_report(doc, now)
        except ValueError:
            with self.lock:
                self.refused += 1
            raise
        with self.lock:
            self.window.add(report)
            self.reports += 1

    def due(self) -> bool:
        now = self.clock()
        if not self.enabled or now < self.due_s:
            return False
        self.due_s = now + self.spec.interval_s
        with self.lock:
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
        with self.lock:
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
        latency_pools = [p.name for p in plan.pools if p.model == spec.model and p.role == "decode"] \
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
        with self.lock:
            self.decisions.append(entry)
            self.acted[(action.pool, "out" if action.delta > 0 else "in")] += 1
        return entry

    def inflight(self) -> dict[str, int]:
        with self.lock:
            return self.window.inflight()

    def status(self, plan: PlacementPlan | None, serving: Mapping[str, int]) -> dict[str, Any]:
        """What `isle status` and the router's `isle_autoscale_*` metrics show."""
        with self.lock:
            return self._status(plan, serving)

    def _status(self, plan: PlacementPlan | None, serving: Mapping[str, int]) -> dict[str, Any]:
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
        return {"pools": pools, "reports": self.reports, "reports_refused": self.refused,
                "interval_s": self.spec.interval_s,
                "decisions": [{**d, "ago_s": round(now - d["time"], 1)} for d in self.decisions]}


class Core(Protocol):
    """What acting needs of the controller (`control.controller.ControllerCore` is one)."""

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
    for r in list(core.running.values()):  # read on call threads too: a copy made in one step
        if not r.draining:
            counts[r.placement.pool] = counts.get(r.placement.pool, 0) + 1
    return counts


def held_elsewhere(core: Core) -> list[ReplicaPlacement]:
    """Replicas that hold GPUs and ids outside the plan: retiring ones, starts in flight, and
    running ones the plan has elsewhere (the old copy of a move) or not at all (kept draining)."""
    planned = {p.replica_id: p for p in core.plan.placements} if core.plan is not None else {}
    return [*(r.placement for r in core.retiring), *core.fleet.starts.targets().values(),
            *(r.placement for rid, r in list(core.running.items()) if planned.get(rid) != r.placement)]


def act(core: Core) -> bool:
    """One decision, acted on; True when it changed what runs (the table is published then)."""
    assert core.plan is not None and core.topology is not None
    lost = _forget_lost_starts(core)
    actions = core.autoscaling.decide(core.plan, core.topology, serving_counts(core), core.spec.slo_classes)
    for a in actions:
        if a.delta > 0:
            _scale_out(core, a)
        else:
            _scale_in(core, a)
    return bool(actions) or lost


def _forget_lost_starts(core: Core) -> bool:
    """An autoscaled replica in the plan that neither runs nor is being started (its start failed,
    or a restarted controller stopped it) leaves the plan: the pool's count says what serves, and
    the next decision adds again if the load wants it."""
    assert core.plan is not None
    lost = [p for p in core.plan.placements if p.pool in core.spec.autoscale.pools
            and p.replica_id not in core.running and p.replica_id not in core.fleet.starts.flight]
    for p in lost:
        core.plan = with_count(core.plan, p.pool, tuple(x for x in core.plan.placements if x is not p))
        core._record("autoscale_start_lost", {"replica_id": p.replica_id, "pool": p.pool, "node": p.node,
                                             "gpus": list(p.gpus)})
    return bool(lost)


def _scale_out(core: Core, a: Action) -> None:
    """New replicas on the GPUs nobody holds, placed by the deployment's placement policy."""
    assert core.plan is not None and core.topology is not None
    core.plan, placed, missing = grow(core.plan, core.topology, a.pool, a.delta, core.spec.policy,
                                      held_elsewhere(core))
    core._record("autoscale", core.autoscaling.record(a, {"missing": missing, "placed": [
        {"replica_id": p.replica_id, "node": p.node, "gpus": list(p.gpus), "tier": p.tier} for p in placed]}))
    for p in placed:
        core._apply(Change(replica_id=p.replica_id, order="start", old=None, new=p, reason=a.reason))


def _scale_in(core: Core, a: Action) -> None:
    """The replicas whose removal costs least (`pools.autoscale.actions.removal_order`) leave the
    plan and the table; a start still in flight for one is dropped."""
    assert core.plan is not None
    health = {r.replica_id: r.health_score for r in core.table.replicas}
    draining = frozenset(rid for rid, r in list(core.running.items()) if r.draining)
    core.plan, gone = shrink(core.plan, a.pool, -a.delta, core.autoscaling.inflight(), health, draining)
    now = core.clock()
    for rid in gone:
        core.fleet.starts.drop(rid, f"scaled in: {a.reason}")
        r = core.running.pop(rid, None)
        if r is not None:
            r.draining, r.idle_from = True, now + IDLE_GRACE_S
            r.retire_by = now + core.spec.autoscale.drain_timeout_s
            core.retiring.append(r)
    core._record("autoscale", core.autoscaling.record(a, {"removed": gone}))
