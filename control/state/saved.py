"""What a restarted controller needs to resume instead of starting duplicates, saved as JSON in
`<state_dir>/state.json` (written whole, then renamed: a crash never leaves half a file; through
control.state.files, which never follows a link; a save that fails leaves the last good
file, which is what a restarted controller resumes from).

It holds the Ray session (a state from an earlier cluster is not resumed), a digest of the
controller's spec (a state made for other settings is not resumed), the plan (with each pool's
replica count: an autoscaled pool's is the autoscaler's, not the spec's), every running
replica (where it runs, a gang's members too, its generation, hence its actor's name, its URL,
whether it drains, the engine ports it holds on its node), the old replicas still being retired, the routing
table's version, the health marks and lost nodes that the topology on disk does not show, and
what the topology bench last measured (each subject's fingerprint and Ray nodes, and its record
file under `<state_dir>/bench/`, where the first record of each fingerprint is kept as its
baseline).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from control.state.files import DiskFiles, StateFiles
from control.state.marks import LinkMark
from pools.model import GangMember, PlacementPlan, PoolSpec, ReplicaPlacement, SLOClass, Unplaced
from pools.ports import EnginePorts

STATE = "state.json"
log = logging.getLogger("isleserve.controller")


@dataclass(frozen=True, slots=True, kw_only=True)
class SavedReplica:
    placement: ReplicaPlacement
    generation: int
    url: str = ""
    draining: bool = False
    ports: EnginePorts | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SavedBench:
    fingerprint: str
    ray_ids: tuple[str, ...]
    ok: bool
    record: str | None = None
    """The latest record's file (None: the last run failed)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ControllerState:
    session: str
    spec_digest: str
    plan: PlacementPlan
    table_version: int
    replicas: Mapping[str, SavedReplica] = field(default_factory=dict)
    retiring: tuple[SavedReplica, ...] = ()
    marks: tuple[LinkMark, ...] = ()
    lost_nodes: tuple[str, ...] = ()
    bench: Mapping[str, SavedBench] = field(default_factory=dict)


def digest(spec: object) -> str:
    return hashlib.sha256(repr(spec).encode()).hexdigest()[:16]


def _placement(p: ReplicaPlacement) -> dict[str, Any]:
    return {"replica_id": p.replica_id, "pool": p.pool, "role": p.role, "node": p.node, "gpus": list(p.gpus),
            "island": p.island, "tier": p.tier, "in_island": p.in_island, "reasons": list(p.reasons),
            "extra_nodes": [[n, list(g)] for n, g in p.extra_nodes], "members": [m.to_json() for m in p.members],
            "in_domain": p.in_domain, "expert_parallel": p.expert_parallel}


def _placement_from(x: dict[str, Any]) -> ReplicaPlacement:
    return ReplicaPlacement(replica_id=x["replica_id"], pool=x["pool"], role=x["role"], node=x["node"],
                            gpus=tuple(x["gpus"]), island=x["island"], tier=x["tier"], in_island=x["in_island"],
                            reasons=tuple(x["reasons"]), extra_nodes=tuple((n, tuple(g)) for n, g in x["extra_nodes"]),
                            members=tuple(_member_from(m) for m in x.get("members", [])),
                            in_domain=bool(x.get("in_domain", True)), expert_parallel=bool(x.get("expert_parallel")))


def _member_from(x: dict[str, Any]) -> GangMember:
    return GangMember(node=x["node"], gpus=tuple(x["gpus"]), dp_rank_start=int(x["dp_rank_start"]),
                      pp_stage=int(x["pp_stage"]), nic=x["nic"])


def _saved(r: SavedReplica) -> dict[str, Any]:
    return {"placement": _placement(r.placement), "generation": r.generation, "url": r.url, "draining": r.draining,
            "ports": r.ports.to_json() if r.ports is not None else None}


def _saved_from(x: dict[str, Any]) -> SavedReplica:
    ports = x.get("ports")
    return SavedReplica(placement=_placement_from(x["placement"]), generation=int(x["generation"]), url=x["url"],
                        draining=bool(x["draining"]), ports=EnginePorts.from_json(ports) if ports else None)


def to_json(state: ControllerState) -> dict[str, Any]:
    plan = state.plan
    return {
        "session": state.session, "spec_digest": state.spec_digest, "table_version": state.table_version,
        "replicas": {k: _saved(v) for k, v in state.replicas.items()},
        "retiring": [_saved(r) for r in state.retiring],
        "marks": [{"node": m.node, "a": m.a, "b": m.b, "reason": m.reason}
                  for m in state.marks],
        "lost_nodes": list(state.lost_nodes),
        "bench": {k: {"fingerprint": b.fingerprint, "ray_ids": list(b.ray_ids), "ok": b.ok, "record": b.record}
                  for k, b in state.bench.items()},
        "plan": {"policy": plan.policy, "topology_fingerprint": plan.topology_fingerprint, "score": plan.score,
                 "pool_replicas": {pool.name: pool.replicas for pool in plan.pools},
                 "reasons": list(plan.reasons), "placements": [_placement(p) for p in plan.placements],
                 "unplaced": [{"pool": u.pool, "count": u.count, "reason": u.reason} for u in plan.unplaced]},
    }


def from_json(doc: dict[str, Any], pools: tuple[PoolSpec, ...], classes: Mapping[str, SLOClass]) -> ControllerState:
    p = doc["plan"]
    placements = tuple(_placement_from(x) for x in p["placements"])
    counts = p.get("pool_replicas", {})  # autoscaled pools: their counts now, not the spec's
    pools = tuple(replace(pool, replicas=int(counts.get(pool.name, pool.replicas))) for pool in pools)
    plan = PlacementPlan(policy=p["policy"], topology_fingerprint=p["topology_fingerprint"], placements=placements,
                         unplaced=tuple(Unplaced(**u) for u in p["unplaced"]), score=p["score"],
                         reasons=tuple(p["reasons"]), pools=pools, slo_classes=dict(classes))
    return ControllerState(session=doc["session"], spec_digest=doc["spec_digest"], plan=plan,
                           table_version=int(doc["table_version"]),
                           replicas={k: _saved_from(v) for k, v in doc["replicas"].items()},
                           retiring=tuple(_saved_from(r) for r in doc["retiring"]),
                           marks=tuple(LinkMark(**m) for m in doc["marks"]),
                           lost_nodes=tuple(doc["lost_nodes"]),
                           bench={k: SavedBench(fingerprint=b["fingerprint"], ray_ids=tuple(b["ray_ids"]), ok=b["ok"],
                                                record=b["record"]) for k, b in doc.get("bench", {}).items()})


def _files(where: StateFiles | str) -> StateFiles:
    return DiskFiles(where) if isinstance(where, str) else where


def save(where: StateFiles | str, state: ControllerState) -> None:
    """Written whole to `state.json.tmp` (made anew, 0600, never through a link), then renamed over
    `state.json`. OSError when it cannot be (the caller fails soft: the old file stays)."""
    _files(where).replace(STATE, json.dumps(to_json(state), indent=1).encode())


def _doc(where: StateFiles | str) -> Any:
    raw = _files(where).read(STATE)
    return json.loads(raw) if raw is not None else None


def load(where: StateFiles | str, pools: tuple[PoolSpec, ...], classes: Mapping[str, SLOClass]
         ) -> ControllerState | None:
    """The saved state, or None when there is none or it cannot be read (then: a fresh deploy)."""
    try:
        doc = _doc(where)
        return from_json(doc, pools, classes) if doc is not None else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def forget(where: StateFiles | str) -> None:
    try:
        _files(where).remove(STATE)
    except OSError as err:  # a later controller finds a state of another session or spec: it does not resume
        log.warning("state.json not removed: %s", err)


def resumable(where: StateFiles | str, session: str, spec_digest: str) -> bool:
    """A saved state of this cluster and these settings exists."""
    try:
        doc = _doc(where)
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("session") == session and doc.get("spec_digest") == spec_digest
