"""A gang replica as the controller runs it: one engine per data-parallel rank (vLLM's external
load balancing: each rank its own server and URL, published as `pools.routing.rank_id`
endpoints), started, restarted and stopped as a unit.

`GangReplica` is the `Replica` protocol over the ranks' own replicas (the backend's, one actor
each), so the starts, restarts, moves and the resume path treat a gang as one replica:

- `start`: the ranks in rank order; all or none: if one fails, those started are stopped and
  `GangFailed` says which rank and why (recorded as a `gang_failed` event);
- `healthy`: every rank answers; `ensure` never restarts a rank in place (the ranks share the
  gang's collectives, so one restarted alone would hang them): a rank down raises
  `GangBroken`, and the restart path stops the gang and starts it whole, a new generation;
- `stop`, also while `start` runs (a dropped start): every rank started so far, and no more.
"""

from __future__ import annotations

import contextlib
import json
import threading
from dataclasses import replace
from typing import Any

from control.backend import Backend, Replica
from control.spec import EngineLaunch
from pools.model import PoolSpec, ReplicaPlacement
from pools.routing import dp_ranks, rank_id


class GangFailed(RuntimeError):
    """A rank of the gang did not start; the ranks started before it were stopped."""

    def __init__(self, replica_id: str, rank: str, reason: str, stopped: list[str]) -> None:
        super().__init__(f"gang {replica_id}: rank {rank} failed to start ({reason}); "
                         f"stopped {', '.join(stopped) or 'no other rank'}")
        self.replica_id, self.rank, self.reason, self.stopped = replica_id, rank, reason, stopped

    def to_json(self) -> dict[str, Any]:
        return {"replica_id": self.replica_id, "rank": self.rank, "reason": self.reason, "stopped": self.stopped}


class GangBroken(RuntimeError):
    """A rank of a running gang is down: the gang restarts whole."""


def rank_placement(p: ReplicaPlacement, rank: int) -> ReplicaPlacement:
    """Data-parallel rank `rank` of gang `p` as a placement of its own: its stage-0 TP group (the
    first member's node and GPUs, the rest on other nodes as `extra_nodes`)."""
    mine = [(m.node, m.gpus) for m in p.members if m.dp_rank_start == rank and m.pp_stage == 0]
    (node, gpus), rest = mine[0], mine[1:]
    return replace(p, replica_id=rank_id(p.replica_id, rank), node=node, gpus=gpus, extra_nodes=tuple(rest),
                   members=(), in_domain=True)


def ranks_of(p: ReplicaPlacement) -> list[int]:
    return [k for k, _ in dp_ranks(p)]


def gang_arg(pool: PoolSpec, p: ReplicaPlacement, rank: int) -> str:
    """`python -m pools sim-engine --gang`'s JSON for rank `rank` of `p`."""
    return json.dumps({"dp": pool.dp, "pp": pool.pp, "expert_parallel": pool.expert_parallel, "dp_rank": rank,
                       "members": [m.to_json() for m in p.members]}, separators=(",", ":"))


def _stop(replica: Replica) -> None:
    with contextlib.suppress(Exception):  # an actor on a lost node is already gone
        replica.stop()


class GangReplica:
    def __init__(self, backend: Backend, launch: EngineLaunch, attached: list[Replica] | None = None) -> None:
        self.backend, self.launch = backend, launch
        self.members: list[Replica] = list(attached or [])
        self.urls: dict[str, str] = {}
        """Rank id -> its URL (what the routing table publishes)."""
        self._lock = threading.Lock()
        self._stopped = False

    @property
    def url(self) -> str:
        return self.urls.get(self.launch.ranks[0].replica_id, "")

    def start(self) -> str:
        for rank in self.launch.ranks:
            with self._lock:
                if self._stopped:
                    raise GangFailed(self.launch.replica_id, rank.replica_id, "the gang was stopped while starting",
                                     list(self.urls))
                replica = self.backend.create(rank)
                self.members.append(replica)
            try:
                self.urls[rank.replica_id] = replica.start()
            except Exception as err:
                started = list(self.urls)
                self.stop()
                raise GangFailed(self.launch.replica_id, rank.replica_id, str(err), started) from None
        return self.url

    def _down(self) -> str | None:
        """The first rank that does not answer, if any."""
        if len(self.members) < len(self.launch.ranks):  # not started (or stopped while starting)
            return self.launch.ranks[len(self.members)].replica_id
        for rank, replica in zip(self.launch.ranks, self.members, strict=True):
            try:
                if not replica.healthy():
                    return rank.replica_id
            except Exception:
                return rank.replica_id
        return None

    def healthy(self) -> bool:
        return self._down() is None

    def ensure(self) -> str:
        down = self._down()
        if down is not None:
            raise GangBroken(f"gang {self.launch.replica_id}: rank {down} is down; the gang restarts as a unit")
        for rank, replica in zip(self.launch.ranks, self.members, strict=True):
            self.urls[rank.replica_id] = replica.ensure()  # alive: its URL, nothing restarted
        return self.url

    def idle(self) -> bool:
        def one(replica: Replica) -> bool:
            try:
                return replica.idle()
            except Exception:
                return True

        return all(one(r) for r in self.members)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            members = list(self.members)
        for replica in members:
            _stop(replica)

    def info(self) -> dict[str, Any]:
        def one(replica: Replica) -> dict[str, Any]:
            try:
                return replica.info()
            except Exception as err:
                return {"error": str(err)}

        return {"replica_id": self.launch.replica_id, "generation": self.launch.generation, "url": self.url,
                "node": self.launch.node, "gpus": list(self.launch.gpus), "urls": dict(self.urls),
                "ranks": {rank.replica_id: one(r) for rank, r in zip(self.launch.ranks, self.members, strict=False)}}


def create(backend: Backend, launch: EngineLaunch) -> Replica:
    """The replica for `launch`: a gang of rank replicas, or the backend's own."""
    return GangReplica(backend, launch) if launch.ranks else backend.create(launch)


def attach(backend: Backend, launch: EngineLaunch) -> Replica | None:
    """What a previous controller started; a gang only whole (the ranks found of a partial one
    are stopped: it is started again as a unit)."""
    if not launch.ranks:
        return backend.attach(launch)
    found = [backend.attach(rank) for rank in launch.ranks]
    members = [r for r in found if r is not None]
    if len(members) == len(found):
        return GangReplica(backend, launch, attached=members)
    for r in members:
        _stop(r)
    return None


def urls_of(replica_id: str, replica: Replica, url: str) -> dict[str, str]:
    """The URLs a running replica publishes: its own, and a gang's ranks'."""
    return {replica_id: url, **(replica.urls if isinstance(replica, GangReplica) else {})}
