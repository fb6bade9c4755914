"""The autoscaling policy acting inside the simulator, as the controller acts live: every
`interval_s` it sees each pool's load (running and waiting requests on its engines, as a scrape
would) and the TTFT/TPOT at each pool's `slo_percentile` of the requests that ended in the last `window_s`, decides
(`pools.autoscale.policy.on_tick`), and acts:

    scale out   new replicas are placed on the GPUs nobody holds (`pools.autoscale.actions`),
                start serving `startup_s` later (until then the router does not see them) and
                hold their GPUs from the decision on
    scale in    the chosen replica stops taking requests at once and keeps serving what it has
                (no stream is cut); when it is empty its GPUs go back

GPU-hours count every GPU a replica holds, from placement (or the decision) to release.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import replace
from typing import Any

from loadtest.model import RequestResult
from loadtest.sim.model import READY, AutoscaleSettings
from loadtest.sim.replica import SimReplica, build_replica
from loadtest.sim.state import SimState
from pools.autoscale.actions import grow, removable, removal_order, with_count
from pools.autoscale.policy import AutoscalerState, ClassLatency, PoolObservation, on_tick
from pools.autoscale.predict import replica_capacity
from pools.model import PlacementPlan, ReplicaPlacement
from pools.routing import dp_ranks, rank_id, table_from_plan


def _percentile(values: list[float], percentile: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(percentile / 100 * len(ordered)) - 1))]


class Autoscaler:
    def __init__(self, sim: SimState, settings: AutoscaleSettings) -> None:
        self.sim = sim
        self.settings = settings
        self.plan: PlacementPlan = sim.config.plan
        self.state = AutoscalerState()
        self.retiring: dict[str, ReplicaPlacement] = {}
        self.held_s = 0.0
        self.last_s = 0.0
        self.seen = 0
        self.recent: deque[tuple[float, RequestResult]] = deque()
        self.timeline: list[dict[str, Any]] = []
        self.samples: dict[str, deque[tuple[float, float, float, int]]] = {
            name: deque([(0.0, 0.0, 0.0, 0)]) for name in settings.configs}
        """Per pool: (t, running, waiting, requests admitted so far) at each tick of the look-back."""
        self.admitted_before: dict[str, int] = {}
        """Per pool: what replicas whose ids were given to new ones had admitted."""

    # GPU-hours
    def _gpus(self) -> int:
        return self.plan.gpus_used + sum(len(p.gpu_refs()) for p in self.retiring.values())

    def _accrue(self, t: float) -> None:
        self.held_s += self._gpus() * max(0.0, t - self.last_s)
        self.last_s = max(self.last_s, t)

    def gpu_hours(self, t: float) -> float:
        self._accrue(t)
        return self.held_s / 3600.0

    # the loop
    def tick(self, t: float) -> bool:
        """One decision round; False once the run has nothing left to serve."""
        self._accrue(t)
        self._release_drained(t)
        results = self.sim.results
        for r in results[self.seen:]:
            self.recent.append((t, r))
        self.seen = len(results)
        while self.recent and self.recent[0][0] < t - self.settings.window_s:
            self.recent.popleft()
        observations = {name: self._observe(t, name) for name in self.settings.configs}
        gpus = self._gpus()
        self.timeline += [{"t": round(t, 3), "pool": name, "replicas": o.replicas, "serving": o.serving,
                           "gpus": gpus} for name, o in observations.items()]
        actions, self.state = on_tick(t, observations, self.settings.configs, self.state)
        for action in actions:
            self.sim.log.append({"t": round(t, 3), "event": "scale", "pool": action.pool, "delta": action.delta,
                                 "reason": action.reason})
            if action.delta > 0:
                self._grow(t, action.pool, action.delta)
            else:
                self._shrink(t, action.pool, -action.delta)
        # open requests that no replica holds could never end (a bug, not a load): the run stops
        return bool(self.sim.events) or (bool(self.sim.reqs) and any(r.requests for r in self.sim.replicas.values()))

    def _observe(self, t: float, pool: str) -> PoolObservation:
        spec = self.plan.pool(pool)
        placed = {p.replica_id for p in self.plan.placements if p.pool == pool}
        reps = [r for r in self.sim.replicas.values() if r.alive and (r.endpoint.gang or r.rid) in placed]
        classes = [self.sim.config.classes[c] for c in spec.slo_classes if c in self.sim.config.classes] or \
            list(self.sim.config.classes.values())
        ids = {rep.rid for rep in reps}
        mine = [r for _, r in self.recent if r.ok and (r.prefill_replica if spec.role == "prefill" else r.replica)
                in ids]
        cfg = self.settings.configs[pool]
        q = cfg.slo_percentile
        latency = {c.name: ClassLatency(
            ttft_ms=_ms(_percentile([r.ttft_s for r in mine if r.slo_class == c.name and r.ttft_s is not None], q)),
            tpot_ms=_ms(_percentile([r.tpot_s for r in mine if r.slo_class == c.name and r.tpot_s is not None], q)),
            ttft_target_ms=c.ttft_ms, tpot_target_ms=c.tpot_ms) for c in classes}
        samples = self.samples[pool]
        admitted = self.admitted_before.get(pool, 0) + sum(
            r.admitted for r in self.sim.replicas.values() if r.endpoint.pool == pool)
        samples.append((t, float(sum(r.core.num_running for r in reps)), float(sum(r.core.num_waiting for r in reps)),
                        admitted))
        while len(samples) > 2 and samples[1][0] <= t - self.settings.look_back_s:
            samples.popleft()
        held = list(samples)[1:] or [samples[-1]]
        span = t - samples[0][0]
        capacity = None
        if cfg.sizing_slo_share is not None and mine:
            capacity = replica_capacity(spec, self.sim.topology, classes,
                                        sum(r.prompt_tokens for r in mine) / len(mine),
                                        sum(r.output_tokens for r in mine) / len(mine), cfg.sizing_slo_share)
        return PoolObservation(
            pool=pool, role=spec.role, replicas=len(placed),
            serving=len({r.endpoint.gang or r.rid for r in reps if r.endpoint.healthy}),
            running=sum(x[1] for x in held) / len(held), waiting=sum(x[2] for x in held) / len(held),
            request_rate=(admitted - samples[0][3]) / span if span > 0 else 0.0, capacity_rps=capacity,
            classes=latency)

    # acting
    def _grow(self, t: float, pool: str, count: int) -> None:
        policy = self.sim.config.plan.policy if self.settings.kind == "topology" else "first-fit"
        self.plan, placed, missing = grow(self.plan, self.sim.topology, pool, count, policy,
                                          list(self.retiring.values()))
        if missing:
            self.sim.log.append({"t": round(t, 3), "event": "scale_out_short", "pool": pool, "missing": missing})
        for p in placed:
            for rep in self._build(p):
                self._register(rep)
                self.sim._at(t + self.settings.startup_s, READY, rep)

    def _build(self, p: ReplicaPlacement) -> list[SimReplica]:
        served = {s.name: s.model or s.name for s in self.plan.pools}
        urls = {p.replica_id: f"sim://{p.replica_id}"}
        if p.members and self.plan.pool(p.pool).dp > 1:
            urls.update({rank_id(p.replica_id, k): f"sim://{rank_id(p.replica_id, k)}" for k, _ in dp_ranks(p)})
        single = replace(self.plan, placements=(p,))
        gpu = self.sim.topology.node(p.node).gpu(p.gpus[0]).model
        table = table_from_plan(single, urls, served, gpu_models={p.replica_id: gpu})
        cfg = self.sim.config
        return [build_replica(self.sim.topology, self.plan, p, replace(e, healthy=False), cfg.max_num_seqs,
                              kv_capacity_tokens=cfg.kv_capacity_tokens) for e in table.replicas]

    def _register(self, rep: SimReplica) -> None:
        sim = self.sim
        old = sim.replicas.get(rep.rid)
        if old is not None:  # a released replica's id comes back: what it admitted still counts
            self.admitted_before[old.endpoint.pool] = self.admitted_before.get(old.endpoint.pool, 0) + old.admitted
        sim.replicas[rep.rid] = rep
        model = rep.endpoint.model
        sim.by_model.setdefault(model, []).append(rep)
        snapshot = sim.snapshots.setdefault(model, [])
        cand = rep.candidate()
        snapshot.append(cand)
        sim.cands[rep.rid] = cand
        sim.slots[rep.rid] = (snapshot, len(snapshot) - 1)

    def ready(self, t: float, rep: SimReplica) -> None:
        if rep.alive and not rep.endpoint.draining:
            rep.endpoint = replace(rep.endpoint, healthy=True)
            self.sim._refresh(rep)
            self.sim.log.append({"t": round(t, 3), "event": "replica_ready", "replica": rep.rid})

    def _shrink(self, t: float, pool: str, count: int) -> None:
        inflight: dict[str, int] = {}
        health: dict[str, float] = {}
        for rep in self.sim.replicas.values():
            key = rep.endpoint.gang or rep.rid
            inflight[key] = inflight.get(key, 0) + rep.inflight
            health[key] = min(health.get(key, 1.0), rep.endpoint.health_score)
        options = removable(self.plan, pool, inflight, health)
        order = removal_order(options) if self.settings.kind == "topology" else \
            [o.replica_id for o in sorted(options, key=lambda o: _index(o.replica_id), reverse=True)]
        gone = set(order[:count])
        self.retiring.update({p.replica_id: p for p in self.plan.placements if p.replica_id in gone})
        self.plan = with_count(self.plan, pool, tuple(p for p in self.plan.placements if p.replica_id not in gone))
        for rid in order[:count]:
            for rep in self._ranks(rid):
                rep.endpoint = replace(rep.endpoint, healthy=False, draining=True)
                self.sim._refresh(rep)
            self.sim.log.append({"t": round(t, 3), "event": "replica_retiring", "replica": rid})

    def _ranks(self, rid: str) -> list[SimReplica]:
        return [r for r in self.sim.replicas.values() if (r.endpoint.gang or r.rid) == rid]

    def _release_drained(self, t: float) -> None:
        for rid in list(self.retiring):
            ranks = self._ranks(rid)
            if all(not r.requests and not r.core.has_work() for r in ranks):
                for r in ranks:
                    r.alive = False
                    r.version += 1
                del self.retiring[rid]
                self.sim.log.append({"t": round(t, 3), "event": "replica_released", "replica": rid})


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _index(replica_id: str) -> int:
    tail = replica_id.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1
