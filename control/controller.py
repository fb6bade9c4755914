"""The controller: topology -> plan -> one pinned replica per placement (a simulated engine or a
real vLLM server, started side by side) -> a versioned routing table; then the health loop.

`check()` is one pass of the loop: a Ray node that left takes its topology node with it; link
counters (a fresh discovery every `counters_interval_s`) and `mark_link` change link health;
either way the replicas whose TP group is hurt are drained (the table says so at once, so
routers stop sending them interactive traffic), re-placed by `replan()` (only what must move),
started before the old ones stop where their GPUs allow it, and published. Engines that die are
restarted in place. A gang (control.launch.gang: one engine per data-parallel rank, each
its own endpoint) is one replica to all of this: started, restarted and moved whole.
Those starts (a restart, a move's replacement, a resumed replica whose
actor is gone) run on worker threads (control.starts, control.fleet): a pass
submits one and goes on; what it started is installed and published once it is up (`settle`,
or the next pass), so a vLLM server loading for minutes holds up no other restart, node loss
or link mark. A Ray node that joins (or comes back) is discovered again. With the bench on
(`BenchPolicy`), every node and a ring of node pairs are benchmarked at deploy, after such
changes and on a schedule (control.benching), and what was measured feeds the cost
model. Everything goes to `<state_dir>/events.jsonl` with the topology fingerprint, and the
state a restarted controller resumes from (engine ports and bench records included) to
`<state_dir>/state.json`. Those writes fail soft (control.state.persist,
control.state.alarms): a full disk or a planted link makes the controller's health "degraded",
with the reason, in the table's plan view that routers follow, and the save is tried again on
every pass; it never stops the controller.

Plain Python over an injected `Backend` (tests run it without Ray); `ControllerActor`
(control.actors) is the detached, named Ray actor around it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from control import nodecheck
from control.autoscaling import IDLE_GRACE_S, Autoscaling, FleetView, decide_changes, held_elsewhere, serving_counts
from control.backend import Backend
from control.benching import BenchKeeper
from control.fleet import Fleet, Running
from control.kvpaths import KvPathWatch
from control.launch import build as launching
from control.launch import gang
from control.spec import ControllerSpec, EngineLaunch
from control.state import marks as health
from control.state import saved as state
from control.state.alarms import Alarms
from control.state.events import EventLog
from control.state.files import DiskFiles, StateFiles
from control.state.persist import StateKeeper
from control.state.secrets import ENGINE_KEY_FILE, TOKEN_FILE, drawn_secret
from control.table import build_table
from pools.model import PlacementPlan, PlacementRequest, ReplicaPlacement
from pools.placement import get_policy
from pools.placement.evict import evict
from pools.placement.replan import Replan, replan
from pools.placement.rollout import Change, changes
from pools.ports import EnginePorts
from pools.routing import EngineKind, RoutingTable
from topology import Topology

CONTROLLER_NAME, NAMESPACE = "isleserve-controller", "isleserve"
__all__ = ["CONTROLLER_NAME", "NAMESPACE", "ControllerCore"]
log = logging.getLogger("isleserve.controller")


class ControllerCore:
    def __init__(self, spec: ControllerSpec, backend: Backend, clock: Callable[[], float] = time.monotonic,
                 files: StateFiles | None = None) -> None:
        """`files`: the state directory's files (default: `spec.state_dir` on disk, created 0700;
        a StateDirError, a ValueError, when it belongs to another user or others may write to it)."""
        if spec.engine not in ("sim", "vllm"):
            raise ValueError(f"engine {spec.engine!r}: sim or vllm")
        missing = [p.name for p in spec.pools if spec.engine == "vllm" and p.name not in spec.vllm]
        if missing:
            raise ValueError(f"engine vllm: no vLLM settings for pools {missing}")
        gangs = [p.name for p in spec.pools if spec.engine == "vllm" and p.is_gang]
        if gangs:
            raise ValueError(f"engine vllm: pools {gangs} are gangs, which the controller starts on the simulated "
                             "engine only")
        self.spec, self.backend, self.clock = spec, backend, clock
        self.files = files if files is not None else DiskFiles(spec.state_dir)
        self.alarms = Alarms()
        self.events = EventLog(self.files, self.alarms)
        self.keeper = StateKeeper(self.files, self.alarms, self._record)
        self.engine_admin_token = drawn_secret(self.files, TOKEN_FILE) if spec.engine_admin_routes else ""
        self.engine_api_key = drawn_secret(self.files, ENGINE_KEY_FILE)
        """What the engines' API wants (vLLM's --api-key): only the router, given it, sends them work."""
        self.published_alarms: tuple[tuple[str, str], ...] = ()
        self.bench = BenchKeeper(spec.bench, self.files, self._record, clock, self.alarms)
        self.fleet = Fleet(backend, spec.ports, self._record, clock, drain_timeout_s=spec.drain_timeout_s,
                           engine=spec.engine)
        self.ports = self.fleet.ports
        self.ray_ids: set[str] = set()
        """The alive Ray nodes at the last look (one that joins is discovered)."""
        self.discovered: Topology | None = None
        self.bindings: Mapping[str, nodecheck.RayNode] = {}
        self.host_names: frozenset[str] = frozenset()
        """This controller's host as Ray names nodes (its address and hostname; set by its actor):
        an engine on a node so named shares its host, and the router's (both on the head node)."""
        self.known: dict[str, nodecheck.RayNode] = {}
        """The last Ray node seen carrying each topology node: a node whose Ray node died between
        two looks is lost even when a discovery in between no longer binds it."""
        self.report = nodecheck.NodeReport()
        self.marks: dict[tuple[str, int, int], health.LinkMark] = {}
        self.lost: set[str] = set()
        self.topology: Topology | None = None
        self.plan: PlacementPlan | None = None
        self.epoch = uuid.uuid4().hex[:12]
        """This incarnation's tables (`RoutingTable.supersedes`): routers take them over a
        predecessor's whatever their versions (it may resume from an older saved state)."""
        self.table = RoutingTable(version=0, replicas=())
        self.last_changes: list[Change] = []
        self.counters_at = clock()
        self.autoscaling = Autoscaling(spec.autoscale, clock)
        self.kv_paths = KvPathWatch(spec.kv_path_action, self._record, clock)

    @property
    def running(self) -> dict[str, Running]:
        return self.fleet.running

    @property
    def retiring(self) -> list[Running]:
        return self.fleet.retiring

    # records ------------------------------------------------------------------------------
    def _record(self, kind: str, payload: dict[str, Any]) -> None:
        self.events.record(kind, self.topology.fingerprint() if self.topology else "", payload)

    def _save(self) -> bool:
        """Save the state (never raising for a failed write); True when the health changed."""
        assert self.plan is not None

        def saved(r: Running, draining: bool) -> state.SavedReplica:
            ports = r.launch.vllm.ports if r.launch.vllm is not None else None
            return state.SavedReplica(placement=r.placement, generation=r.launch.generation, url=r.url,
                                      draining=draining, ports=ports)

        return self.keeper.save(state.ControllerState(
            session=self.backend.session(), spec_digest=state.digest(self.spec), plan=self.plan,
            table_version=self.table.version, replicas={rid: saved(r, r.draining) for rid, r in self.running.items()},
            retiring=(*(saved(r, True) for r in self.retiring), *(  # a resumed controller stops starts it lost
                state.SavedReplica(placement=i.placement, generation=i.launch.generation, draining=True)
                for i in self.fleet.starts.flight.values())), marks=tuple(self.marks.values()),
            lost_nodes=tuple(sorted(self.lost)), bench=self.bench.saved()))

    # topology -----------------------------------------------------------------------------
    def _discover(self) -> Topology:
        found = self.backend.discover(self.spec.topology_source)
        self.discovered, self.bindings = found.topology, found.bindings
        self.known.update(found.bindings)
        self.ray_ids = {n.node_id for n in self.backend.nodes() or () if n.alive}
        report = nodecheck.check(found.topology, found.bindings, found.simulated)
        if report != self.report:  # said once, not on every counters pass
            for level, line in report.lines():
                log.log(level, "node check: %s", line)
            if self.topology is not None:
                self._record("node_check", report.to_json())
        self.report = report
        return self._effective()

    def _effective(self) -> Topology:
        """The discovered topology with marks and lost nodes applied, and what was measured."""
        assert self.discovered is not None
        return self.bench.measured(health.effective(self.discovered, self.marks.values(), self.lost))

    # replicas -----------------------------------------------------------------------------
    def _launch(self, p: ReplicaPlacement, generation: int, ports: EnginePorts | None = None) -> EngineLaunch:
        """`ports`: the ones the replica held (a resumed or restarted one keeps them); else the
        lowest free ones on its node."""
        assert self.plan is not None and self.topology is not None
        vllm = self.spec.vllm.get(p.pool) if self.spec.engine == "vllm" else None
        if vllm is not None and ports is None:
            ports = self.ports.allocate(p.node, side_channel=p.role != "mixed")
        # pinned by every binding ever seen: a node whose Ray node just died (not yet called lost)
        # keeps its dead pin, so the start fails there instead of running "anywhere" under its name
        return launching.build_launch(self.plan, self.topology, self.known, p, generation,
                                      topology_source=self.spec.topology_source, time_scale=self.spec.time_scale,
                                      vllm=vllm, ports=ports, admin_routes=self.spec.engine_admin_routes,
                                      admin_token=self.engine_admin_token, api_key=self.engine_api_key,
                                      engine_args=self.spec.engine_args.get(p.pool, ()),
                                      kv_events_endpoint=self.spec.kv_events_endpoint, host_names=self.host_names,
                                      kv_block_size=self.spec.kv_block_size)

    def _start_all(self, placements: tuple[ReplicaPlacement, ...]) -> None:
        """Every placement's replica at once, waiting for them (the first deploy); if one fails,
        all are stopped and its error raised."""
        launches = []
        for p in placements:  # each in the books before the next chooses its ports (one node, other ports)
            launches.append(self._launch(p, self.fleet.generation(p.replica_id)))
            self.ports.begin(launches[-1])
        try:
            results = launching.start_all(self.backend, launches, self.ports.reallocate)
        finally:
            for x in launches:
                self.ports.end(x.actor_name)
        failed = [r for r in results if isinstance(r, Exception)]
        for x, r in zip(launches, results, strict=True):
            if isinstance(r, gang.GangFailed):
                self._record("gang_failed", {**r.to_json(), "start": "deploy", "generation": x.generation})
        for p, r in zip(placements, results, strict=True):
            if isinstance(r, launching.Started):
                self.running[p.replica_id] = self.fleet.started(p, r)
        if failed:
            raise failed[0]

    # deploy and resume --------------------------------------------------------------------
    def deploy(self) -> RoutingTable:
        """Resume a saved state of this cluster and spec, else discover, plan, start, publish."""
        if self._resume():
            return self.table
        self.topology = self._discover()
        self._record("topology", {"reason": "deploy", "nodes": [n.name for n in self.topology.nodes],
                                  "node_check": self.report.to_json()})
        if self._bench_due():  # before the engines start: the bench has the links to itself, the plan its figures
            self.topology = self._effective()
        request = PlacementRequest(topology=self.topology, pools=self.spec.pools, slo_classes=self.spec.slo_classes)
        self.plan = get_policy(self.spec.policy).place(request)
        self._record("plan", self.plan.to_json())
        try:
            self._start_all(self.plan.placements)
        except Exception as err:  # leave nothing behind: a retried deploy starts clean
            self._record("deploy_failed", {"error": str(err)})
            self.shutdown()
            raise
        return self._publish()

    def _resume(self) -> bool:
        if not state.resumable(self.files, self.backend.session(), state.digest(self.spec)):
            return False
        saved = state.load(self.files, self.spec.pools, self.spec.slo_classes)
        if saved is None:
            return False
        self.marks = {m.key: m for m in saved.marks}
        self.lost = set(saved.lost_nodes)
        self.bench.restore(saved.bench)
        self.topology, self.plan = self._discover(), saved.plan
        self.table = RoutingTable(version=saved.table_version, replicas=())
        for r in (*saved.replicas.values(), *saved.retiring):
            rid = r.placement.replica_id
            self.fleet.generations[rid] = max(self.fleet.generations.get(rid, -1), r.generation)
        reattached, started = [], []
        for rid, r in saved.replicas.items():
            launch = self._launch(r.placement, r.generation, r.ports)
            replica = gang.attach(self.backend, launch)
            if replica is None:  # installed by a later pass once it is up
                launch = self._launch(r.placement, self.fleet.generation(rid), r.ports)
                self.fleet.starts.resume(launch, r.placement, r.draining)
                started.append(rid)
                continue
            url = replica.ensure() if self.fleet.healthy(replica) else r.url  # else: restarted by the next pass
            self.running[rid] = Running(replica=replica, launch=launch, placement=r.placement, url=url,
                                        draining=r.draining, retire_by=0.0)
            reattached.append(rid)
        for r in saved.retiring:  # draining ones finish their streams; a lost start is idle: both stop when idle
            launch = self._launch(r.placement, r.generation, r.ports)
            old = gang.attach(self.backend, launch)
            if old is not None:
                timeout_s = self.spec.autoscale.drain_timeout_s if r.placement.pool in self.spec.autoscale.pools \
                    else self.spec.drain_timeout_s
                self.retiring.append(Running(replica=old, launch=launch, placement=r.placement, url=r.url,
                                             draining=True, retire_by=self.clock() + timeout_s))
        self._record("resumed", {"reattached": reattached, "restarted": started, "table_version": saved.table_version})
        self._publish()
        if self.topology.fingerprint() != self.plan.topology_fingerprint:
            self._topology_changed("the topology changed while the controller was away", self.topology)
        return True

    # publishing ---------------------------------------------------------------------------
    def _serving(self) -> PlacementPlan:
        """The plan as it runs: where every running replica is (a drained one may be in no plan)."""
        assert self.plan is not None
        return replace(self.plan, placements=tuple(r.placement for r in self.running.values()))

    def _urls(self) -> dict[str, str]:
        """Each running replica's URL, and each gang rank's (`pools.routing.rank_id`)."""
        return {k: url for rid, r in self.running.items() for k, url in gang.urls_of(rid, r.replica, r.url).items()}

    def _publish(self) -> RoutingTable:
        assert self.plan is not None and self.topology is not None
        serving = self._serving()
        urls = self._urls()
        draining = {rid for rid, r in self.running.items() if r.draining}
        served = {pool: s.served_model_name for pool, s in self.spec.vllm.items()}
        engine: EngineKind = "vllm" if self.spec.engine == "vllm" else "sim"
        self.table = replace(build_table(serving, self.topology, urls, draining, self.table.version + 1, served,
                                         engine, publishing={rid for rid, r in self.running.items()
                                                             if r.launch.kv_events}), epoch=self.epoch)
        self._record("routing_table", {"version": self.table.version, "replicas": len(self.table.replicas),
                                       "draining": sorted(draining)})
        self.published_alarms = self.alarms.signature()
        if self._save():  # the health changed: routers follow versions, so the health they read is current
            self.table = replace(self.table, version=self.table.version + 1)
            self.published_alarms = self.alarms.signature()
            self._save()
        return self.table

    # health -------------------------------------------------------------------------------
    def mark_link(self, node: str, a: int, b: int, healthy: bool = False, reason: str = "") -> list[dict[str, Any]]:
        """Take a link out of service (or give it back); returns the moves this caused."""
        assert self.discovered is not None
        health.check_mark(self.discovered, node, a, b)
        mark = health.LinkMark(node=node, a=a, b=b, reason=reason or "marked unhealthy by the operator")
        if healthy:
            self.marks.pop(mark.key, None)
        else:
            self.marks[mark.key] = mark
        what = f"link {node}:gpu{a}-gpu{b} marked {'healthy' if healthy else 'unhealthy'}"
        done = self._topology_changed(what, self._effective())
        return [c.to_json() for c in done]

    def _topology_changed(self, why: str, new: Topology) -> list[Change]:
        assert self.plan is not None and self.topology is not None
        old, self.topology = self.topology, new
        if new.fingerprint() == self.plan.topology_fingerprint:
            return []  # the plan already fits this graph (scores may differ: see _read_counters)
        self._record("topology", {"reason": why, "previous": old.fingerprint(), "lost_nodes": sorted(self.lost),
                                  "marks": [m.key for m in self.marks.values()]})
        return self._carry_out(replan(self.plan, new, previous=old, held=self._held()), why)

    def _carry_out(self, result: Replan, why: str) -> list[Change]:
        """A re-plan's plan recorded, installed and carried out (`apply`), the table published."""
        where = {**{rid: r.placement for rid, r in self.running.items()}, **self.fleet.starts.targets()}
        todo = changes(where, result.plan, result.moves)
        self._record("plan", {**result.plan.to_json(), "reason": why, "moves": [c.to_json() for c in todo]})
        self.apply(result.plan, todo, why)
        self.last_changes = todo
        self._publish()
        return todo

    def replace_replica(self, replica_id: str, reason: str = "") -> list[dict[str, Any]]:
        """Move one serving replica make-before-break off its GPUs, and off their NICs where room
        allows (`pools.placement.evict`); the moves. ValueError: no such replica serving steadily,
        or no room."""
        assert self.plan is not None and self.topology is not None
        r = self.running.get(replica_id)
        if r is None or r.draining or replica_id in self.fleet.starts.flight:
            raise ValueError(f"replica {replica_id!r} is not serving steadily (unknown, being started or draining)")
        why = reason or "re-placed by the operator"
        found = evict(self.plan, self.topology, replica_id, why, held=self._held())
        self._record("replace", {"replica_id": replica_id, "reason": why, "where": found.why})
        if found.replan is None:
            raise ValueError(found.why)
        return [c.to_json() for c in self._carry_out(found.replan, f"re-place {replica_id}: {why}")]

    def apply(self, plan: PlacementPlan, todo: Sequence[Change], why: str) -> None:
        """Install `plan` and carry out its changes: the one way a re-plan (a topology change) and
        the autoscaler change what runs. Replicas leaving their GPUs drain first (published to the
        routers before anything starts); replacements and new replicas start on worker threads and
        are installed once up (`fleet.starts`); retired ones leave the table at once, finish what
        they serve and stop once idle. The caller publishes the table after."""
        self.plan = plan
        moving = [c for c in todo if c.old is not None and c.order != "retire"]
        for c in moving:
            if c.replica_id in self.running:
                self.running[c.replica_id].draining = True
        if moving:
            self._record("drain", {"replicas": [c.replica_id for c in moving], "reason": why})
            self._publish()  # routers stop sending interactive traffic to them now
        for c in todo:
            self.fleet.submit(c, self._launch, self.spec.autoscale.drain_timeout_s, IDLE_GRACE_S)

    def _held(self) -> list[ReplicaPlacement]:
        return held_elsewhere(self.plan, self.running, self.retiring, self.fleet.starts.targets())

    def fleet_view(self) -> FleetView:
        """What the autoscaler decides on: plain values, read in one step."""
        assert self.plan is not None and self.topology is not None
        running = dict(self.running)
        return FleetView(plan=self.plan, topology=self.topology, serving=serving_counts(running),
                         running={rid: r.placement for rid, r in running.items()},
                         draining=frozenset(rid for rid, r in running.items() if r.draining),
                         held=tuple(self._held()), starting=frozenset(self.fleet.starts.flight),
                         health={r.replica_id: r.health_score for r in self.table.replicas})

    def _autoscale(self) -> bool:
        """One autoscaling tick, applied; True when it changed what runs (the table is published then)."""
        decision = decide_changes(self.autoscaling, self.fleet_view(), self.spec.policy, self.spec.slo_classes)
        if decision is None:
            return False
        for kind, payload in decision.events:
            self._record(kind, payload)
        self.apply(decision.plan, decision.changes, "autoscale")
        return True

    def check(self) -> RoutingTable:
        """One pass of the health loop."""
        if self.topology is None or self.plan is None:
            return self.table
        changed = self.fleet.settle()
        self._watch_nodes()
        self._read_counters()
        submitted = self.fleet.restart_dead(self.lost, self._launch)
        if self.fleet.retire() or submitted or self.keeper.retry_due:
            self._save()  # what stopped, what is being started (a resumed controller stops it), or a failed save
        if self._bench_due():
            self.topology = self._effective()
            changed = True  # routers follow the table's version to the measured topology
        if self.autoscaling.due():
            changed = self._autoscale() or changed
        busy = frozenset(self.fleet.starts.flight) | {rid for rid, r in self.running.items() if r.draining}
        self.kv_paths.act(frozenset(self.running), busy, self.replace_replica)  # publishes what it moves
        changed = changed or self.alarms.signature() != self.published_alarms  # the routers' /health follows
        return self._publish() if changed else self.table

    # autoscaling (control.autoscaling) -------------------------------------------
    def observe(self, report: Any) -> dict[str, Any]:
        """A router's load report in; the autoscaler's status out (the router's metrics show it)."""
        try:
            self.autoscaling.observe(report)
            self.kv_paths.observe(report)  # recorded by the next pass (this call holds no lock)
        except ValueError as err:
            refused = self.autoscaling.refused
            if refused & (refused - 1) == 0:  # the 1st, 2nd, 4th, 8th ...: a flood does not flood the log
                log.warning("autoscaling: load report refused (%d so far): %s", refused, err)
        return self.autoscaling.status(self.plan, serving_counts(self.running)) if self.autoscaling.enabled else {}

    def _bench_due(self) -> bool:
        """Run the benches that are due; True when something new was measured."""
        if not self.spec.bench.enabled:
            return False
        assert self.topology is not None
        return self.bench.run_due(self.backend, self.topology, self.bindings, everywhere=self.backend.nodes() is None,
                                  simulated=self.spec.topology_source != "nvml", source=self.spec.topology_source)

    def _watch_nodes(self) -> None:
        nodes = self.backend.nodes()
        if nodes is None or self.discovered is None:
            return
        alive = {n.node_id for n in nodes if n.alive}
        joined, self.ray_ids = alive - self.ray_ids, alive
        if joined:  # a new or returning node: whatever topology node it carries is back
            self._discover()
            back = {name for name in self.lost if name in self.bindings and self.bindings[name].node_id in alive}
            self.lost -= back
            self._record("nodes_joined", {"ray_nodes": sorted(joined), "back": sorted(back)})
            why = f"Ray node back: {', '.join(sorted(back))}" if back else "Ray node joined"
            self._topology_changed(why, self._effective())  # re-plans only if the graph changed
        gone = {name for name, ray in self.known.items() if ray.node_id not in alive and name not in self.lost}
        if gone:
            self.lost |= gone
            self.bench.forget(gone)  # back later: measured again
            self._topology_changed(f"Ray node gone: {', '.join(sorted(gone))}", self._effective())

    def _read_counters(self) -> None:
        if self.spec.counters_interval_s <= 0 or self.clock() - self.counters_at < self.spec.counters_interval_s:
            return
        self.counters_at = self.clock()
        scores = {r.replica_id: (r.healthy, r.health_score) for r in self.table.replicas}
        if not self._topology_changed("link counters changed", self._discover()):
            assert self.plan is not None and self.topology is not None
            fresh = build_table(self._serving(), self.topology, self._urls(), (), 0)
            if {r.replica_id: (r.healthy, r.health_score) for r in fresh.replicas} != scores:
                self._publish()  # a link's score moved without changing the plan

    def settle(self, timeout_s: float | None = 0.0) -> RoutingTable:
        """Install the starts that ended (after waiting up to `timeout_s` for all of them; None:
        as long as they take), publishing if that changed the table. The health loop calls it
        when a start ends; a pass does it first."""
        if timeout_s != 0.0:
            self.fleet.starts.wait(timeout_s)
        return self._publish() if self.fleet.settle() and self.plan is not None else self.table

    # views --------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """What the admin API shows beside the plan: node checks, draining, last moves."""
        return {"table_version": self.table.version, "node_check": self.report.to_json(),
                "draining": sorted(rid for rid, r in self.running.items() if r.draining),
                "retiring": [r.placement.replica_id for r in self.retiring],
                "starting": {rid: i.kind for rid, i in sorted(self.fleet.starts.flight.items())},
                "marked_links": [list(m.key) for m in self.marks.values()], "lost_nodes": sorted(self.lost),
                "last_moves": [c.to_json() for c in self.last_changes], "events": str(self.events.path),
                "bench": self.bench.status(), "health": self.alarms.health(), "kv_paths": self.kv_paths.status(),
                "transport_env": {rid: list(r.transport_env) for rid, r in sorted(self.running.items())
                                  if r.transport_env},
                **({"autoscaling": self.autoscaling.status(self.plan, serving_counts(self.running))}
                   if self.autoscaling.enabled else {})}

    def shutdown(self) -> None:
        """Stop every replica, those being started included, and forget the saved state (a later
        controller starts afresh)."""
        self.fleet.stop_all()
        state.forget(self.files)
        self._record("shutdown", {})
