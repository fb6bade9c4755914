"""Faults on the simulator's timeline and what the health loop does about them: a degraded link
slows the TP groups it crosses and drains them once noticed; a lost node takes its replicas (a
gang's every rank) and retries the requests that had no token yet. A PD pair's KV transport
(`physics.kvpath`): `kv_transport_fallback` moves its KV at TCP speed, `kv_remote_nic` at `factor`
of its rate, `kv_restore` ends either; transfers started afterwards follow it (nothing drains)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from loadtest.sim.model import DRAIN, Fault
from loadtest.sim.replica import SimReplica
from loadtest.sim.state import SimState
from physics.kvpath import NO_FAULT, KvPathFault

KV_FAULTS: dict[str, Callable[[Fault], KvPathFault]] = {"kv_transport_fallback": lambda f: KvPathFault(transport="tcp"),
             "kv_remote_nic": lambda f: KvPathFault(bandwidth_factor=f.factor), "kv_restore": lambda f: NO_FAULT}


def on_fault(sim: SimState, t: float, fault: Fault) -> None:
    if fault.kind in KV_FAULTS:
        if len(fault.pair) != 2 or any(r not in sim.replicas for r in fault.pair):
            raise ValueError(f"{fault.kind} at {fault.at_s} s: pair {list(fault.pair)} is not two replicas of the plan")
        pair = (fault.pair[0], fault.pair[1])
        sim.kv_faults[pair] = KV_FAULTS[fault.kind](fault)
        sim.log.append({"t": round(t, 3), "event": fault.kind, "pair": list(pair)})
        return
    sim.log.append({"t": round(t, 3), "event": fault.kind, "node": fault.node, "gpus": list(fault.gpus)})
    if fault.kind == "node_loss":
        for rep in [r for r in sim.replicas.values() if r.placement.node == fault.node or fault.node in r.nodes]:
            lose(sim, t, rep)
        return
    for rep in [r for r in sim.replicas.values() if r.crossed_by(fault.node, fault.gpus)]:
        if fault.kind == "link_degrade":
            rep.degrade(fault.factor)
            sim._at(t + sim.config.detect_s, DRAIN, (rep, fault.factor))
        elif fault.kind == "link_restore":
            rep.restore()
            sim._refresh(rep)
        else:
            raise ValueError(f"unknown fault kind {fault.kind!r} (link_degrade, link_restore, node_loss, "
                             f"{', '.join(KV_FAULTS)})")


def on_drain(sim: SimState, t: float, obj: tuple[SimReplica, float]) -> None:
    rep, factor = obj
    if rep.core.link == rep.base_link:
        return  # restored meanwhile
    rep.endpoint = replace(rep.endpoint, health_score=factor, draining=True)
    sim._refresh(rep)
    sim.log.append({"t": round(t, 3), "event": "drain", "replica": rep.rid})


def lose(sim: SimState, t: float, rep: SimReplica) -> None:
    rep.alive = False
    rep.version += 1
    rep.endpoint = replace(rep.endpoint, healthy=False)
    sim._refresh(rep)
    sim.log.append({"t": round(t, 3), "event": "replica_lost", "replica": rep.rid,
                     "requests": len(rep.requests)})
    for rid in sorted(rep.requests):
        req = sim.reqs.get(rid)
        if req is None:
            continue
        if req.first_s is not None:
            sim._record(req, t, "error:502 replica lost mid-stream")
        elif req.retries < sim.config.retries:
            req.retries += 1
            req.first_s, req.itls = None, []
            sim._route(t, req)
        else:
            sim._record(req, t, "error:502 retries exhausted")
    rep.requests.clear()
