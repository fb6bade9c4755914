"""The live autoscaler: the router's load reports in (`observe`, every second), a decision every
`interval_s` on the controller's health loop (`decide`: the pure policy of
`pools.autoscale.policy` on observations from `pools.autoscale.observe`, with the sizing model's
capacity from `pools.autoscale.predict`), and what operators read (`status`: each pool's counts,
what the autoscaler saw, and its last decisions with their reasons). A tick returns its changes
(`decide_changes`: a new plan, `start` and `retire` changes) and the controller applies them
through `ControllerCore.apply`, the method re-plans use: a new replica is a move's replacement
with nothing to replace (started on a worker thread, installed and published once up); a retired
one leaves the plan and the table at once, finishes what it serves and stops once idle. Nothing
here blocks: a decision is arithmetic on what the reports said.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from control.fleet import Running
from control.spec import AutoscaleSpec
from pools.autoscale.actions import grow, shrink, with_count
from pools.autoscale.observe import Window, parse_report
from pools.autoscale.policy import Action, AutoscalerState, PoolObservation, on_tick
from pools.autoscale.predict import replica_capacity
from pools.model import PlacementPlan, ReplicaPlacement, SLOClass
from pools.placement.rollout import Change
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


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetView:
    """What a decision reads of the controller, as plain values (`ControllerCore.fleet_view`)."""

    plan: PlacementPlan
    topology: Topology
    running: Mapping[str, ReplicaPlacement]
    """Installed replicas by id (draining ones included)."""
    draining: frozenset[str]
    held: tuple[ReplicaPlacement, ...]
    """Replicas holding GPUs and ids outside the plan (`held_elsewhere`)."""
    starting: frozenset[str]
    """Replicas whose start is in flight."""
    health: Mapping[str, float]
    """Each replica's health score in the published table."""

    serving: Mapping[str, int]
    """Per pool, the replicas taking traffic (`serving_counts`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """What one autoscaling tick wants: the plan after it and the changes that get there (new
    replicas start, removed ones retire), applied by `ControllerCore.apply` like any re-plan, and
    the events to record."""

    plan: PlacementPlan
    changes: tuple[Change, ...] = ()
    events: tuple[tuple[str, dict[str, Any]], ...] = ()


def serving_counts(running: Mapping[str, Running]) -> dict[str, int]:
    """Per pool, the replicas taking traffic (installed, not draining)."""
    counts: dict[str, int] = {}
    for r in list(running.values()):  # read on call threads too: a copy made in one step
        if not r.draining:
            counts[r.placement.pool] = counts.get(r.placement.pool, 0) + 1
    return counts


def held_elsewhere(plan: PlacementPlan | None, running: Mapping[str, Running], retiring: Sequence[Running],
                   starting: Mapping[str, ReplicaPlacement]) -> list[ReplicaPlacement]:
    """Replicas that hold GPUs and ids outside the plan: retiring ones, starts in flight, and
    running ones the plan has elsewhere (the old copy of a move) or not at all (kept draining)."""
    planned = {p.replica_id: p for p in plan.placements} if plan is not None else {}
    return [*(r.placement for r in retiring), *starting.values(),
            *(r.placement for rid, r in list(running.items()) if planned.get(rid) != r.placement)]


def decide_changes(autoscaling: Autoscaling, view: FleetView, policy: str, classes: Mapping[str, SLOClass]
                   ) -> Decision | None:
    """One tick: the policy's actions turned into a new plan and its changes; None when nothing
    changes. An autoscaled replica in the plan that neither runs nor is being started (its start
    failed, or a restarted controller stopped it) leaves the plan first: the pool's count says what
    serves, and the next decision adds again if the load wants it."""
    plan = view.plan
    events: list[tuple[str, dict[str, Any]]] = []
    lost = [p for p in plan.placements if p.pool in autoscaling.spec.pools
            and p.replica_id not in view.running and p.replica_id not in view.starting]
    for p in lost:
        plan = with_count(plan, p.pool, tuple(x for x in plan.placements if x is not p))
        events.append(("autoscale_start_lost", {"replica_id": p.replica_id, "pool": p.pool, "node": p.node,
                                                "gpus": list(p.gpus)}))
    actions = autoscaling.decide(plan, view.topology, view.serving, classes)
    if not actions and not lost:
        return None
    changes: list[Change] = []
    for a in actions:
        if a.delta > 0:  # new replicas on the GPUs nobody holds, placed by the deployment's policy
            plan, placed, missing = grow(plan, view.topology, a.pool, a.delta, policy, list(view.held))
            events.append(("autoscale", autoscaling.record(a, {"missing": missing, "placed": [
                {"replica_id": p.replica_id, "node": p.node, "gpus": list(p.gpus), "tier": p.tier} for p in placed]})))
            changes.extend(Change(replica_id=p.replica_id, order="start", old=None, new=p, reason=a.reason)
                           for p in placed)
        else:  # the replicas whose removal costs least (`pools.autoscale.actions.removal_order`)
            plan, gone = shrink(plan, a.pool, -a.delta, autoscaling.inflight(), view.health, view.draining)
            changes.extend(Change(replica_id=rid, order="retire", old=view.running.get(rid), new=None,
                                  reason=f"scaled in: {a.reason}") for rid in gone)
            events.append(("autoscale", autoscaling.record(a, {"removed": gone})))
    return Decision(plan=plan, changes=tuple(changes), events=tuple(events))
