"""The faults, done for real to a running deployment, and what the run watches meanwhile.

`Observer` polls the router's routing table (`/admin/replicas`) twice a second and samples the
router process's RSS every second. Each fault acts, then waits (at most `recover_timeout_s`) for
the table to show the deployment recovered, and returns its record: times on the run's clock,
what was done to which process, what the controller logged (`events.jsonl`).

    replica_crash   SIGKILL to the engine process listening on the replica's port, once the router
                    has `min_streams` requests on it; recovered when the replica serves from a
                    restarted engine (a new URL in the table)
    link_degrade    the engine's TP link slowed (`link_bandwidth_factor`), `detect_after_s` later
                    `python -m pools mark-link NODE A B`; recovered when the replacement serves
    node_loss       every process of the Ray node carrying the node; detected when the table
                    marks its replicas, recovered when all of them serve from other nodes
    overload        the offered load times `factor` for `duration_s`

The KV-path faults (one prefill->decode pair's KV at TCP speed, or at a share of its rate) are
in `loadtest.chaos.kvfaults`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from control.state.files import DiskFiles
from control.state.secrets import TOKEN_FILE
from loadtest.chaos.cluster import ChaosCluster, listening_pid, rss_mb
from loadtest.chaos.driver import ChaosDriver
from loadtest.chaos.spec import ChaosSpec, Fault, LinkDegrade, NodeLoss, Overload, ReplicaCrash
from loadtest.live.client import Target
from loadtest.live.deploy import ROOT, ray_env
from wire import client
from wire.promtext import EngineLoad, engine_load

POLL_S = 0.5


@dataclass(frozen=True, slots=True)
class ReplicaView:
    replica_id: str
    node: str
    gpus: tuple[int, ...]
    url: str
    healthy: bool
    draining: bool
    inflight: int
    breaker_open: bool


@dataclass(slots=True)
class Observer:
    admin: Target
    admin_key: str
    now: Callable[[], float]
    router_port: int
    in_flight: Callable[[], int]
    table: dict[str, ReplicaView] = field(default_factory=dict)
    version: int = 0
    changes: list[dict[str, Any]] = field(default_factory=list)
    """The table each time something other than load changed: (time, version, replicas)."""
    rss: list[tuple[float, float, int]] = field(default_factory=list)
    kv_paths: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The router's KV-path verdicts now, per pair (`prefill->decode`): verdict, avoided, ratio."""
    kv_changes: list[dict[str, Any]] = field(default_factory=list)
    """The verdicts each time a pair's verdict or avoidance changed: (time, pairs)."""
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    seen: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        pid, last_rss = listening_pid(self.router_port), -1.0
        while not self.stopping.is_set():
            with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
                await self._poll()
            if self.now() - last_rss >= 1.0:
                last_rss = self.now()
                mb = rss_mb(pid) if pid is not None else None
                if mb is None:
                    pid = listening_pid(self.router_port)
                else:
                    self.rss.append((self.now(), mb, self.in_flight()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), POLL_S)
        await self.admin.aclose()

    async def _poll(self) -> None:
        status, body = await self.admin.get_json("/admin/replicas", self.admin_key)
        if status != 200 or not isinstance(body, dict):
            return
        table = {r["replica_id"]: ReplicaView(replica_id=r["replica_id"], node=r["node"], gpus=tuple(r["gpus"]),
                                              url=r["url"], healthy=bool(r["healthy"]), draining=bool(r["draining"]),
                                              inflight=int(r["inflight"]), breaker_open=bool(r["breaker_open"]))
                 for r in body["replicas"]}
        shape = {k: (v.node, v.url, v.healthy, v.draining, v.breaker_open) for k, v in table.items()}
        if shape != {k: (v.node, v.url, v.healthy, v.draining, v.breaker_open) for k, v in self.table.items()}:
            self.changes.append({"at_s": round(self.now(), 2), "version": body["version"],
                                 "replicas": {k: {"node": n, "url": u, "healthy": h, "draining": d, "breaker_open": b}
                                              for k, (n, u, h, d, b) in sorted(shape.items())}})
        self.table, self.version = table, int(body["version"])
        self._kv(body.get("kv_paths"))
        self.seen.set()

    def _kv(self, view: Any) -> None:
        if not isinstance(view, dict):
            return
        rows = {str(p["pair"]): {"verdict": str(p["verdict"]), "avoided": bool(p["avoided"]),
                                 "bandwidth_ratio": p.get("bandwidth_ratio"), "samples": p.get("samples")}
                for p in view.get("pairs", [])}
        shape = {k: (v["verdict"], v["avoided"]) for k, v in rows.items()}
        if shape != {k: (v["verdict"], v["avoided"]) for k, v in self.kv_paths.items()}:
            self.kv_changes.append({"at_s": round(self.now(), 2), "pairs": rows})
        self.kv_paths = rows

    def first_change(self, after_s: float, what: Callable[[Mapping[str, Mapping[str, Any]]], bool]) -> float | None:
        """When the recorded table first satisfied `what` at or after `after_s` (from the history,
        so a table seen while the run was busy elsewhere still counts at the time it was seen)."""
        return next((float(c["at_s"]) for c in self.changes if c["at_s"] >= after_s and what(c["replicas"])), None)

    async def wait_for(self, what: Callable[[Mapping[str, ReplicaView]], bool], timeout_s: float) -> float | None:
        """The run-clock time the table first satisfies `what` (None: not within `timeout_s`)."""
        deadline = self.now() + timeout_s
        while self.now() < deadline:
            if what(self.table):
                return self.now()
            await asyncio.sleep(POLL_S / 2)
        return None


@dataclass(slots=True)
class FaultContext:
    spec: ChaosSpec
    cluster: ChaosCluster
    driver: ChaosDriver
    observer: Observer
    wall_offset: float
    """time.time() minus the run clock: controller events onto the run clock."""
    lifts: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    """Faults that last until the end of the run: undone then (`lift_all`), also after an error."""

    async def lift_all(self) -> None:
        while self.lifts:
            await self.lifts.pop()()

    def events(self, kind: str, after_s: float) -> list[dict[str, Any]]:
        return [{**e, "at_s": round(e["time"] - self.wall_offset, 2)} for e in self.cluster.events()
                if e.get("kind") == kind and e["time"] - self.wall_offset >= after_s]


def _post(url: str, body: Mapping[str, Any], key: str | None = None) -> Any:
    return client.post_json(url, body, key=key, timeout_s=5)


def engine_admin_token(ctx: FaultContext) -> str | None:
    """The token the deployment's engines want on their admin routes (the controller keeps it in
    the run's state directory)."""
    saved = DiskFiles(ctx.cluster.state_dir).read(TOKEN_FILE)
    return saved.decode().strip() if saved else None


def _engine_load(url: str) -> EngineLoad:
    return engine_load(client.get_text(f"{url}/metrics", timeout_s=5))


async def replica_crash(f: ReplicaCrash, ctx: FaultContext) -> dict[str, Any]:
    obs, timeout = ctx.observer, ctx.spec.recover_timeout_s
    await obs.wait_for(lambda t: f.replica in t and t[f.replica].inflight >= f.min_streams, timeout)
    old = obs.table[f.replica]
    pid = listening_pid(urlsplit(old.url).port or 0)
    if pid is None:
        return {"error": f"no process listens on {old.url}"}
    load = await asyncio.to_thread(_engine_load, old.url)
    inflight = obs.table[f.replica].inflight
    os.kill(pid, signal.SIGKILL)
    at = ctx.driver.now()
    back = await obs.wait_for(lambda t: f.replica in t and t[f.replica].url != old.url and t[f.replica].healthy,
                              timeout)
    return {"at_s": at, "recovered_s": back, "replica": f.replica, "node": old.node, "engine_pid": pid,
            "router_inflight_at_kill": inflight, "engine_running_at_kill": load.running,
            "engine_waiting_at_kill": load.waiting, "new_url": obs.table.get(f.replica, old).url,
            "controller": [{"at_s": e["at_s"], "kind": e["kind"], "url": e.get("url")}
                           for e in ctx.events("restart", at) if e.get("replica_id") == f.replica][:3]}


def _mark_link(address: str, node: str, a: int, b: int) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "pools", "mark-link", "--address", address, node, str(a), str(b),
                           "--reason", "chaos run: NVLink degraded"], cwd=ROOT, env=ray_env(), capture_output=True,
                          text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"mark-link exited {done.returncode}: {done.stderr.strip()[-400:]}")
    return dict(json.loads(done.stdout))


async def _stopped(ctx: FaultContext, replica: str, after_s: float, timeout_s: float) -> tuple[float | None, bool]:
    """When the controller stopped the replica it replaced, and whether it was idle then (else its
    drain timeout cut what it still had)."""
    deadline = ctx.driver.now() + timeout_s
    while ctx.driver.now() < deadline:
        found = [e for e in ctx.events("stopped", after_s) if e.get("replica_id") == replica]
        if found:
            return float(found[0]["at_s"]), bool(found[0].get("idle"))
        await asyncio.sleep(POLL_S)
    return None, False


async def link_degrade(f: LinkDegrade, ctx: FaultContext) -> dict[str, Any]:
    obs, timeout = ctx.observer, ctx.spec.recover_timeout_s
    old = obs.table[f.replica]
    if len(old.gpus) < 2:
        return {"error": f"{f.replica} has no TP link (GPUs {list(old.gpus)})"}
    a, b = old.gpus[0], old.gpus[1]
    await asyncio.to_thread(_post, f"{old.url}/admin/faults", {"link_bandwidth_factor": f.bandwidth_factor},
                            engine_admin_token(ctx))
    at = ctx.driver.now()
    await asyncio.sleep(f.detect_after_s)
    marked_from = ctx.driver.now()
    moves = await asyncio.to_thread(_mark_link, ctx.cluster.head.address, old.node, a, b)
    marked = ctx.driver.now()
    back = await obs.wait_for(lambda t: f.replica in t and t[f.replica].url != old.url and t[f.replica].healthy
                              and not t[f.replica].draining, timeout)
    draining = obs.first_change(marked_from, lambda t: f.replica not in t or t[f.replica]["draining"]
                                or t[f.replica]["url"] != old.url)
    served = obs.first_change(marked_from, lambda t: f.replica in t and t[f.replica]["url"] != old.url
                              and t[f.replica]["healthy"] and not t[f.replica]["draining"])
    noticed = [e["at_s"] for e in ctx.events("topology", at) if "marked unhealthy" in str(e.get("reason"))]
    drained, idle = await _stopped(ctx, f.replica, at, ctx.cluster.args.drain_timeout_s + 15)
    return {"at_s": at, "recovered_s": (served or back) if back is not None else None, "replica": f.replica,
            "node": old.node, "link": [a, b], "bandwidth_factor": f.bandwidth_factor,
            "mark_link_started_s": marked_from, "mark_link_returned_s": marked,
            "controller_marked_s": noticed[0] if noticed else None, "table_draining_s": draining,
            "drained_s": drained, "drained_idle": idle, "moves": moves.get("moves", []),
            "new_placement": {"node": obs.table[f.replica].node, "gpus": list(obs.table[f.replica].gpus)}
            if f.replica in obs.table else None}


async def node_loss(f: NodeLoss, ctx: FaultContext) -> dict[str, Any]:
    obs, timeout = ctx.observer, ctx.spec.recover_timeout_s
    victims = sorted(rid for rid, r in obs.table.items() if r.node == f.node)
    if not victims:
        return {"error": f"no replica runs on {f.node}"}
    killed = ctx.cluster.kill_node(f.node)
    at = ctx.driver.now()

    def gone(t: Mapping[str, ReplicaView]) -> bool:
        return all(v not in t or t[v].node != f.node or not t[v].healthy or t[v].draining for v in victims)

    def moved(t: Mapping[str, ReplicaView]) -> bool:
        return all(v in t and t[v].node != f.node and t[v].healthy and not t[v].draining for v in victims)

    detected = await obs.wait_for(gone, timeout)
    back = await obs.wait_for(moved, timeout)
    noticed = [e["at_s"] for e in ctx.events("topology", at) if "Ray node gone" in str(e.get("reason"))]
    serving: dict[str, float] = {}  # each victim's first replacement serving
    for e in ctx.events("move", at):
        if e.get("replica_id") in victims and e.get("result") == "replacement serving":
            serving.setdefault(str(e["replica_id"]), float(e["at_s"]))
    return {"at_s": at, "recovered_s": back, "node": f.node, "replicas": victims, "processes_killed": killed,
            "detected_s": detected, "controller_noticed_s": noticed[0] if noticed else None,
            "controller_replaced_s": max(serving.values()) if len(serving) >= len(victims) else None,
            "replaced_s_by_replica": serving,
            "lost_node_in_table_after": any(r.node == f.node for r in obs.table.values()),
            "new_placements": {v: {"node": obs.table[v].node, "gpus": list(obs.table[v].gpus)}
                               for v in victims if v in obs.table}}


async def overload(f: Overload, ctx: FaultContext) -> dict[str, Any]:
    ctx.driver.multiplier = f.factor
    at = ctx.driver.now()
    try:
        await asyncio.sleep(f.duration_s)
    finally:
        ctx.driver.multiplier = 1.0
    return {"at_s": at, "recovered_s": ctx.driver.now(), "factor": f.factor,
            "peak_in_flight": max((n for t, _, n in ctx.observer.rss if t >= at), default=None)}


ACTIONS: dict[str, Callable[[Any, FaultContext], Awaitable[dict[str, Any]]]] = {
    "replica_crash": replica_crash, "link_degrade": link_degrade, "node_loss": node_loss, "overload": overload}


async def inflict(f: Fault, ctx: FaultContext,
                  actions: Mapping[str, Callable[[Any, FaultContext], Awaitable[dict[str, Any]]]] = ACTIONS
                  ) -> dict[str, Any]:
    """Do one fault and wait for recovery; a fault that could not be done is a record with `error`."""
    started = ctx.driver.now()
    try:
        record = await actions[f.kind](f, ctx)
    except Exception as err:  # the run goes on: the report says what failed
        record = {"error": f"{type(err).__name__}: {err}"}
    record.setdefault("at_s", started)
    record["kind"] = f.kind
    record["spec"] = f.model_dump()
    return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in record.items()}


def wall_offset(now: Callable[[], float]) -> float:
    return time.time() - now()
