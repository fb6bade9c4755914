"""The offline simulator: a discrete-event simulation of a whole deployment on a virtual clock.

What runs is the product's own code, unchanged: the policy's plan, each replica's batching core
(`simengine.core`, with its exact decode fast-forward) and the router's decisions (`decide`,
`pd_decide`) on candidates built as the live router builds them (load as of the last scrape, its
own in-flight counts and latency). Modelled: KV transfers sharing NICs and links
(`loadtest.sim.network`), link faults slowing the TP groups they cross, lost nodes. As live: a
request with no token yet is retried elsewhere when its replica is lost (up to `retries`), one
that has streamed fails; a degraded replica is drained once the health loop notices.
"""

from __future__ import annotations

import heapq
import math
import random
import zlib
from collections.abc import Callable, Sequence
from typing import Any

from kvblocks.keys import block_keys
from loadtest.model import OK, RequestResult, TraceRequest
from loadtest.sim import faults, prefix
from loadtest.sim.autoscale import Autoscaler
from loadtest.sim.model import (
    ARRIVAL,
    AUTOSCALE,
    FAULT,
    KV_READY,
    NET,
    RUN_END,
    SCRAPE,
    START,
    STEP_END,
    Fault,
    SimConfig,
    SimResult,
    _Req,
    result_of,
)
from loadtest.sim.network import Network, legs
from loadtest.sim.replica import Phase, SimReplica, build_replicas
from loadtest.sim.tokens import token_ids
from physics import kvtransfer
from physics.kvpath import NO_FAULT, KvPathFault
from router.admission import Admission
from router.decision import decide
from router.plugins.model import Candidate, RouteRequest
from router.plugins.pd import PDDecision
from router.plugins.profile import Profile
from simengine.fastforward import DecodeRun
from topology import GpuRef

PREFIX_BLOCKS = 4
PLAN_STEPS = 64
"""Decode steps planned at once: arrivals usually cut a run short, so longer plans are waste. A
plan also stops after the step in progress at the next scrape, which always commits the run so
far (the steps planned past it would never be used)."""


class Simulation:
    def __init__(self, config: SimConfig, workload: Sequence[TraceRequest]) -> None:
        self.config = config
        self.topology = config.topology
        self.replicas = build_replicas(self.topology, config.plan, config.max_num_seqs, config.kv_capacity_tokens,
                                       config.experts, config.prefix_caching)
        self.pulled = 0
        """Prompt tokens read from a peer's prefix cache (`router.plugins.cachettft` pulls)."""
        self.by_model: dict[str, list[SimReplica]] = {}
        for r in self.replicas.values():
            self.by_model.setdefault(r.endpoint.model, []).append(r)
        self.cands: dict[str, Candidate] = {rid: r.candidate() for rid, r in self.replicas.items()}
        self.snapshots: dict[str, list[Candidate]] = {
            model: [self.cands[r.rid] for r in reps] for model, reps in self.by_model.items()}
        """Each model's candidates in `by_model` order, kept current by `_refresh`."""
        self.slots: dict[str, tuple[list[Candidate], int]] = {
            r.rid: (self.snapshots[model], i) for model, reps in self.by_model.items() for i, r in enumerate(reps)}
        """Where each replica's candidate sits in its model's snapshot."""
        self.next_scrape_s = math.inf
        """When the router's next scrape is due (every run in progress then is committed)."""
        self.workload = workload
        self.reqs: dict[str, _Req] = {}
        self.results: list[RequestResult] = []
        self.events: list[tuple[float, int, int, Any, int]] = []
        self.seq = 0
        self.network = Network()
        self.rng = random.Random(config.seed)
        self.turn = 0
        self.default_profile = Profile()
        self.next_transfer = 0
        self.transfers: dict[int, _Req] = {}
        self.kv_faults: dict[tuple[str, str], KvPathFault] = {}
        """(prefill, decode) -> the transport fault on that pair's KV (`loadtest.sim.faults`)."""
        self.log: list[dict[str, Any]] = []
        self.count = 0
        self.autoscaler = Autoscaler(self, config.autoscale) if config.autoscale is not None else None

    # events
    def _at(self, t: float, kind: int, obj: Any = None, version: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, obj, version))

    def run(self, until_s: float = math.inf) -> SimResult:
        for tr in self.workload:
            self._at(tr.arrival_s, ARRIVAL, tr)
        for fault in self.config.faults:
            self._at(fault.at_s, FAULT, fault)
        if self.autoscaler is not None:
            self._at(self.autoscaler.settings.interval_s, AUTOSCALE)
        if self.replicas:
            self._at(0.0, SCRAPE)
            self.next_scrape_s = 0.0
        now = 0.0
        handlers: list[Callable[[float, Any, int], None]] = [  # indexed by the event kind
            self._arrival, self._start, self._step_end, self._run_end, self._net, self._kv_ready, self._scrape,
            self._fault, self._drain, self._autoscale, self._ready]
        pending, events, pop = len(self.workload), self.events, heapq.heappop
        while events:
            t, _, kind, obj, version = pop(events)
            if t > until_s:
                break
            now = t
            self.count += 1
            if kind != SCRAPE:
                handlers[kind](t, obj, version)
            elif not self._scrape_tick(t, pending):
                break
        for req in list(self.reqs.values()):  # still open when the run stopped
            self._record(req, now, "timeout")
        self.reqs.clear()
        gpu_hours = self.autoscaler.gpu_hours(now) if self.autoscaler is not None else \
            self.config.plan.gpus_used * now / 3600.0
        cores = [r.core for r in self.replicas.values()]
        prefix = {"queries": sum(c.prefix_queries for c in cores), "hits": sum(c.prefix_hits for c in cores),
                  "pulled": self.pulled} if self.config.prefix_caching else {}
        return SimResult(results=sorted(self.results, key=lambda r: r.index), duration_s=now, events=self.count,
                         log=self.log, gpu_hours=gpu_hours, prefix=prefix,
                         timeline=self.autoscaler.timeline if self.autoscaler is not None else [])

    # routing (the live router's decision functions, on the live router's kind of snapshot)
    def _candidates(self, model: str) -> list[Candidate]:
        """The router's snapshot of the model's replicas (a copy: later refreshes do not change it)."""
        return self.snapshots[model][:] if model in self.snapshots else []

    def _refresh(self, r: SimReplica) -> None:
        rid, cand = r.endpoint.replica_id, r.candidate()
        self.cands[rid] = cand
        snapshot, i = self.slots[rid]
        snapshot[i] = cand

    def _arrival(self, t: float, tr: TraceRequest, _v: int) -> None:
        cls = self.config.classes.get(tr.slo_class)
        if cls is None:
            raise ValueError(f"request {tr.index}: unknown SLO class {tr.slo_class!r}")
        model = self._model_for(tr)
        head = zlib.crc32(",".join(map(str, tr.prefix_blocks[:PREFIX_BLOCKS])).encode()) if tr.prefix_blocks else 0
        req = _Req(trace=tr, rid=f"q{tr.index}", cls=cls,
                   route=RouteRequest(model, cls, tr.prompt_tokens, head, topology=self.topology))
        if self.config.prefix_caching:
            req.tokens = token_ids(tr)
            if self.config.kv_index:
                req.keys = block_keys(req.tokens[:-1], prefix.BLOCK_SIZE)  # never the last token (vLLM computes it)
        self.reqs[req.rid] = req
        self._route(t, req)

    def _model_for(self, tr: TraceRequest) -> str:
        return self.config.model or min(self.by_model)

    def _route(self, t: float, req: _Req) -> None:
        prefix.cached(self, req)
        snapshot = self._candidates(req.route.model)
        if req.cls.sheddable and Admission.overloaded(snapshot):
            self._record(req, t, "shed")
            return
        pd = self._pd_choice(req, snapshot)
        if pd is not None:
            req.pd = pd
            req.prefill = pd.prefill.endpoint.replica_id
            req.replica = pd.decode.endpoint.replica_id
            req.tier = pd.tiers.get(req.replica, pd.tier)
            req.phase = "prefill"
            self._assign(t, self.replicas[req.prefill], req, 1, hold=True)
            return
        self.turn += 1
        profile = self.config.profiles.get(req.cls.name, self.default_profile)
        decision = decide(req.route, snapshot, profile, self.rng, self.turn)
        if decision.winner is None:
            self._record(req, t, "error:503 no replica")
            return
        rep = self.replicas[decision.winner.endpoint.replica_id]
        req.replica, req.prefill, req.tier, req.phase = rep.rid, "", rep.endpoint.tier, "decode"
        pull = prefix.pull_of(profile, req.route, decision.winner, snapshot)
        if pull is not None and prefix.start_pull(self, t, req, rep, pull):
            return
        self._assign(t, rep, req, req.trace.output_tokens)

    def _pd_choice(self, req: _Req, snapshot: list[Candidate]) -> PDDecision | None:
        if not self.config.pd_enabled:
            return None
        mixed = any(c.endpoint.role == "mixed" for c in snapshot)  # as the router: by the table, not health
        return self.config.pd_choice(req.route, snapshot, self.topology,
                                     min_prompt_tokens=self.config.pd_min_prompt_tokens, has_mixed=mixed)

    # replicas
    def _assign(self, t: float, rep: SimReplica, req: _Req, max_tokens: int, hold: bool = False,
                remote: bool = False) -> None:
        self._interrupt(t, rep)
        core = rep.core
        prompt = req.trace.prompt_tokens
        max_tokens = max(1, max_tokens)
        if prompt + max_tokens > core.total_blocks * core.config.block_size:
            self._record(req, t, "error:400 too long for the replica's KV cache")
            return
        core.add(req.rid, prompt, max_tokens, priority=req.cls.priority, hold_kv=hold, remote_prefill=remote,
                 token_ids=req.tokens)
        rep.requests.add(req.rid)
        rep.inflight += 1
        rep.admitted += 1
        self._refresh(rep)
        if rep.phase is Phase.IDLE:
            self._start(t, rep, rep.version)

    def _interrupt(self, t: float, rep: SimReplica) -> None:
        """A request arrives: an idle replica's clock catches up; a decode run stops after the
        step in progress (the newcomer joins the next step, as in vLLM)."""
        if rep.phase is Phase.WAIT:
            rep.phase = Phase.IDLE
            rep.version += 1  # the wake-up for the KV arrival: the newcomer starts a step now
        if rep.phase is Phase.IDLE:
            rep.core.advance_to(t)
        elif rep.phase is Phase.RUN and rep.run is not None:
            run, steps = rep.run, rep.run.steps_by(t)
            rep.core.apply_decode(run, steps)
            self._run_tokens(run, steps)
            rep.run, rep.phase = None, Phase.STEP
            rep.pending = None
            rep.version += 1
            self._at(rep.core.now, START, rep, rep.version)

    def _start(self, t: float, rep: SimReplica, version: int) -> None:
        if version != rep.version or not rep.alive:
            return
        core = rep.core
        core.advance_to(t)
        run = core.decode_plan(self.next_scrape_s, PLAN_STEPS) if self.config.fast_forward else None
        rep.version += 1
        if run is not None:
            rep.phase, rep.run = Phase.RUN, run
            if run.ends_s[-1] <= self.next_scrape_s:  # else the scrape commits it first: no RUN_END to wait for
                self._at(run.ends_s[-1], RUN_END, rep, rep.version)
            return
        result = core.step()
        if result is not None:
            rep.phase, rep.pending = Phase.STEP, result
            self._at(core.now, STEP_END, rep, rep.version)
            return
        rep.phase = Phase.IDLE
        nxt = core.next_ready_s()
        if nxt is not None and nxt > t:
            rep.phase = Phase.WAIT
            self._at(nxt, START, rep, rep.version)

    def _run_end(self, t: float, rep: SimReplica, version: int) -> None:
        if version != rep.version or rep.run is None:
            return
        run, rep.run = rep.run, None
        rep.core.apply_decode(run, run.steps)
        self._run_tokens(run, run.steps)
        rep.phase = Phase.IDLE
        self._start(t, rep, rep.version)

    def _run_tokens(self, run: DecodeRun, steps: int) -> None:
        if steps <= 0:
            return
        gap = (run.ends_s[steps - 1] - run.start_s) / steps
        end = run.ends_s[steps - 1]
        for rid in run.rids:
            req = self.reqs.get(rid)
            if req is not None:
                if len(req.itls) < self.config.max_itl_samples:
                    req.itls.append(gap)
                req.last_s = end

    def _step_end(self, t: float, rep: SimReplica, version: int) -> None:
        if version != rep.version or rep.pending is None:
            return
        result, rep.pending = rep.pending, None
        for rid in result.tokens:
            req = self.reqs.get(rid)
            if req is None:
                continue
            if req.phase == "prefill":
                continue  # the prefill's token is not the client's: it comes from the decode side
            if req.first_s is None:
                req.first_s = t
                rep.observe_latency((t - req.trace.arrival_s) * 1000)
            elif len(req.itls) < self.config.max_itl_samples:
                req.itls.append(t - req.last_s)
            req.last_s = t
        for rid in result.finished:
            req = self.reqs.get(rid)
            if req is None:
                continue
            if req.phase == "prefill":
                self._prefill_done(t, rep, req)
            else:
                rep.inflight -= 1
                rep.requests.discard(rid)
                self._refresh(rep)
                self._record(req, t, OK)
        rep.phase = Phase.IDLE
        self._start(t, rep, rep.version)

    # PD: the KV moves from the prefill's GPUs to the decode's over the topology
    def _prefill_done(self, t: float, prefill: SimReplica, req: _Req) -> None:
        prefill.inflight -= 1
        prefill.requests.discard(req.rid)
        self._refresh(prefill)
        decode = self.replicas[req.replica]
        model = prefill.core.config.model
        gb = kvtransfer.kv_bytes(model, req.trace.prompt_tokens) / 1e9
        src = [GpuRef(prefill.placement.node, g) for g in prefill.placement.gpus]
        dst = [GpuRef(decode.placement.node, g) for g in decode.placement.gpus]
        fault = self.kv_faults.get((prefill.rid, decode.rid), NO_FAULT)
        route, latency_s = legs(self.topology, src, dst, gb, fault, model)
        req.phase = "transfer"
        if not route:
            self._at(t, KV_READY, req)
            return
        self.next_transfer += 1
        self.transfers[self.next_transfer] = req
        self.network.start(t, self.next_transfer, route)
        req.kv_latency_s = latency_s
        self._schedule_net()

    def _schedule_net(self) -> None:
        nxt = self.network.next_done()
        if nxt is not None:
            self._at(nxt, NET, None, self.network.version)

    def _net(self, t: float, _obj: Any, version: int) -> None:
        if version != self.network.version:
            return
        for tid in self.network.finish_due(t):
            req = self.transfers.pop(tid)
            self._at(t + req.kv_latency_s, KV_READY, req)
        self._schedule_net()

    def _kv_ready(self, t: float, req: _Req, _v: int) -> None:
        if req.phase == "pull":
            prefix.pulled(self, t, req)
            return
        prefill = self.replicas[req.prefill]
        prefill.core.release(req.rid)
        if prefill.phase is Phase.IDLE and prefill.alive and prefill.core.has_work():
            self._interrupt(t, prefill)  # held KV was all that kept its queue from running
            self._start(t, prefill, prefill.version)
        decode = self.replicas[req.replica]
        if not decode.alive or not decode.endpoint.healthy:
            others = [self.cands[r.rid] for r in self.by_model[req.route.model] if r.endpoint.role == "decode"
                      and r.alive and r.endpoint.healthy]
            if not others:
                self._record(req, t, "error:502 no decode replica")
                return
            decode = self.replicas[min(others, key=lambda c: (c.load.waiting, c.load.inflight)).endpoint.replica_id]
            req.replica = decode.rid
        req.phase = "decode"
        self._assign(t, decode, req, req.trace.output_tokens, remote=True)

    # the router's view refreshes on its scrape interval
    def _scrape_tick(self, t: float, pending: int) -> bool:
        """The scrape due at `t`, then the next one scheduled; False when the run is over (every
        request has its result, or nothing else is left to happen)."""
        self.next_scrape_s = t + self.config.scrape_interval_s  # first: a plan made from here on stops there
        self._scrape(t, None, 0)
        if len(self.results) >= pending or not self.events:
            return False
        self._at(self.next_scrape_s, SCRAPE)
        return True

    def _scrape(self, t: float, _obj: Any, _v: int) -> None:
        """Every replica's load as the router scrapes it. Every run in progress is committed here,
        which is why `_start` plans no further than the next scrape and, for a run that reaches
        it, schedules no RUN_END (it could only come stale). Starts no plan itself."""
        for rep in self.replicas.values():
            if rep.phase is Phase.RUN:  # an engine's KV grows every step: commit the run so far
                self._interrupt(t, rep)
            rep.scrape()
            rep.core.kv_events.clear()  # the router's view is read from the caches themselves (`_cached`)
            self._refresh(rep)

    # faults and the health loop (`loadtest.sim.faults`), autoscaling (`loadtest.sim.autoscale`)
    def _fault(self, t: float, fault: Fault, _v: int) -> None:
        faults.on_fault(self, t, fault)

    def _drain(self, t: float, obj: tuple[SimReplica, float], _v: int) -> None:
        faults.on_drain(self, t, obj)

    def _autoscale(self, t: float, _obj: Any, _v: int) -> None:
        if self.autoscaler is not None and self.autoscaler.tick(t):
            self._at(t + self.autoscaler.settings.interval_s, AUTOSCALE)

    def _ready(self, t: float, rep: SimReplica, _v: int) -> None:
        if self.autoscaler is not None:
            self.autoscaler.ready(t, rep)

    # results
    def _record(self, req: _Req, t: float, outcome: str) -> None:
        if req.phase == "done":
            return
        req.phase = "done"
        self.reqs.pop(req.rid, None)
        self.results.append(result_of(req, t, outcome))


def simulate(config: SimConfig, workload: Sequence[TraceRequest], until_s: float = math.inf) -> SimResult:
    return Simulation(config, workload).run(until_s)
