"""Starts that run beside the health loop: a dead replica's restart, a move's replacement, a
resumed replica whose actor is gone. Each runs on a worker of a bounded pool and the controller
goes on at once (a vLLM server may take 20 minutes to load; node loss, link marks and the other
restarts do not wait for it). What ended is handed back to the controller, under its lock, by
`settle`: only then does its state change.

A replica id has at most one current start (an `Intent`, with a token). A newer decision for it
(a move, a lost node, shutdown) drops that one (`drop`): the replica it created is stopped at
once, which ends its start, and whatever the start still returns is stopped, never installed.

The workers live as long as the pool, not one start: a simulated engine started locally dies
with the thread that started it (PR_SET_PDEATHSIG, wire.lifecycle), and an idle
ThreadPoolExecutor worker waits for the next job instead of ending. `close` ends them (as
would dropping the pool unclosed).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from control.backend import Backend, Replica
from control.launch.build import MAX_PARALLEL_STARTS, Started, start_one, stop_quietly
from control.launch.portbook import PortBook
from control.spec import EngineLaunch
from pools.model import ReplicaPlacement
from pools.placement.rollout import Change

CLOSE_WAIT_S = 120.0
"""`close`: how long the starts in flight get to end once their replicas were stopped (a replica
actor busy starting answers a stop only after RemoteReplica's stop timeout, then it is killed)."""
log = logging.getLogger("isleserve.controller")


@dataclass(frozen=True, slots=True, kw_only=True)
class Intent:
    """One start in flight: what it is for and what it starts."""

    kind: Literal["restart", "move", "resume"]
    token: int
    launch: EngineLaunch
    """What it starts; for a restart, only if the replica's actor itself died (else the actor's
    `ensure()` restarts its engine)."""
    placement: ReplicaPlacement
    change: Change | None = None
    """A move's change."""
    draining: bool = False
    """A resumed replica that was draining."""

    @property
    def replica_id(self) -> str:
        return self.launch.replica_id


@dataclass(frozen=True, slots=True, kw_only=True)
class Restarted:
    """The replica's actor lived and restarted its engine; the URL (port) may differ."""

    url: str


Outcome = Started | Restarted | Exception
Install = Callable[[Intent, Outcome], bool]


class Dropped(RuntimeError):
    """Raised into a start that a newer decision dropped."""


class Starts:
    def __init__(self, backend: Backend, ports: PortBook, record: Callable[[str, dict[str, Any]], None],
                 workers: int = MAX_PARALLEL_STARTS) -> None:
        self.backend, self.ports, self.record, self.workers = backend, ports, record, workers
        self.flight: dict[str, Intent] = {}
        """Replica id -> its current start (changed on the controller's side only, under its lock)."""
        self.finished = threading.Event()
        """Set when a start ends: the health loop wakes to install it."""
        self._pool: ThreadPoolExecutor | None = None
        self._tokens = itertools.count(1)
        self._cond = threading.Condition()  # guards what the workers touch: the four below
        self._active = 0
        self._done: list[tuple[Intent, Outcome]] = []
        self._created: dict[int, Replica] = {}
        self._dropped: set[int] = set()
        self._stops: list[threading.Thread] = []

    # submitting (the controller's side) --------------------------------------------------
    def restart(self, replica: Replica, fresh: EngineLaunch, placement: ReplicaPlacement) -> Intent:
        """`replica.ensure()`; if its actor died (or a rank of a gang is down), it is stopped and
        `fresh` started on its GPUs."""
        intent = Intent(kind="restart", token=next(self._tokens), launch=fresh, placement=placement)

        def job() -> Outcome:
            try:
                return Restarted(url=replica.ensure())
            except Exception as err:  # the actor itself died: a new one on the same GPUs
                result = "the whole gang, new generation" if intent.launch.ranks else "new actor"
                self.record("restart", {"replica_id": intent.replica_id, "error": str(err), "result": result})
                stop_quietly(replica)
                return self._start(intent)

        return self._submit(intent, job)

    def move(self, change: Change, launch: EngineLaunch, stop_first: Replica | None) -> Intent:
        """The replacement; `stop_first`: the old replica, stopped before it (break-before-make)."""
        assert change.new is not None
        intent = Intent(kind="move", token=next(self._tokens), launch=launch, placement=change.new, change=change)

        def job() -> Outcome:
            if stop_first is not None:
                stop_quietly(stop_first)
            return self._start(intent)

        return self._submit(intent, job)

    def resume(self, launch: EngineLaunch, placement: ReplicaPlacement, draining: bool) -> Intent:
        intent = Intent(kind="resume", token=next(self._tokens), launch=launch, placement=placement,
                        draining=draining)
        return self._submit(intent, lambda: self._start(intent))

    def _submit(self, intent: Intent, job: Callable[[], Outcome]) -> Intent:
        self.drop(intent.replica_id, "superseded by a newer start")
        self.ports.begin(intent.launch)
        with self._cond:
            self._active += 1
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="isle-start")
        self.flight[intent.replica_id] = intent
        future = self._pool.submit(self._run, job)
        future.add_done_callback(lambda f: self._ended(intent, f))
        return intent

    def drop(self, replica_id: str, reason: str) -> None:
        """A newer decision for the replica: its start in flight, if any, is never installed; the
        replica it created is stopped now (its start then fails), or when the start returns."""
        intent = self.flight.pop(replica_id, None)
        if intent is None:
            return
        self.record("start_dropped", {"replica_id": replica_id, "start": intent.kind,
                                      "generation": intent.launch.generation, "reason": reason})
        with self._cond:
            self._dropped.add(intent.token)
            replica = self._created.pop(intent.token, None)
        if replica is not None:
            self._stop(replica, None)

    # on the workers ------------------------------------------------------------------------
    def _start(self, intent: Intent) -> Started:
        return start_one(self.backend, intent.launch, self.ports.reallocate, lambda r: self._creating(intent, r))

    def _creating(self, intent: Intent, replica: Replica) -> None:
        with self._cond:
            if intent.token in self._dropped:
                raise Dropped(f"replica {intent.replica_id}: start dropped")
            self._created[intent.token] = replica

    @staticmethod
    def _run(job: Callable[[], Outcome]) -> Outcome:
        try:
            return job()
        except Exception as err:  # the outcome, for the controller to record
            return err

    def _ended(self, intent: Intent, future: Future[Outcome]) -> None:
        failed = None if future.cancelled() else future.exception()
        outcome: Outcome = (RuntimeError("cancelled: the controller shut down") if future.cancelled() else
                            RuntimeError(f"start ended: {failed!r}") if failed is not None else future.result())
        with self._cond:
            self._created.pop(intent.token, None)
            self._done.append((intent, outcome))
            self._active -= 1
            self._cond.notify_all()
        self.finished.set()

    def _stop(self, replica: Replica, actor_name: str | None) -> None:
        """On a thread of its own (a stop may take a minute; no worker waits for it)."""

        def stop() -> None:
            stop_quietly(replica)
            if actor_name is not None:
                self.ports.end(actor_name)

        thread = threading.Thread(target=stop, name="isle-stop", daemon=True)
        thread.start()
        with self._cond:
            self._stops = [t for t in self._stops if t.is_alive()] + [thread]

    # taking results (the controller's side) ------------------------------------------------
    def settle(self, install: Install) -> bool:
        """Hand each start that ended and is still current to `install` (the controller's lock
        held), then take its launch off the port books (an installed replica holds its ports
        now); stop what dropped ones started. True when an install changed something."""
        self.finished.clear()
        with self._cond:
            done, self._done = self._done, []
            self._dropped -= {i.token for i, _ in done}
        changed = False
        for intent, outcome in done:
            name = intent.launch.actor_name if not isinstance(outcome, Started) else outcome.launch.actor_name
            if self.flight.get(intent.replica_id) is intent:
                del self.flight[intent.replica_id]
                try:
                    changed = install(intent, outcome) or changed
                except Exception:  # a bug: the other starts are still installed, this one stopped
                    log.exception("installing the start of %s", intent.replica_id)
                    if isinstance(outcome, Started):
                        self._stop(outcome.replica, None)
                self.ports.end(name)
            elif isinstance(outcome, Started):
                self._stop(outcome.replica, name)
            else:
                self.ports.end(name)
        return changed

    def wait(self, timeout_s: float | None) -> bool:
        """Until no start runs (True), or `timeout_s` passed (False)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._active == 0, timeout_s)

    def targets(self) -> dict[str, ReplicaPlacement]:
        """Where each replica being started will run."""
        return {rid: i.placement for rid, i in self.flight.items()}

    def close(self, timeout_s: float = CLOSE_WAIT_S) -> None:
        """Drop every start, wait for them to end, stop what they started, let the workers go."""
        for rid in list(self.flight):
            self.drop(rid, "shutdown")
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        if not self.wait(timeout_s):
            log.warning("starts still running after %g s; what they start is stopped when they end", timeout_s)
        self.settle(lambda intent, outcome: False)
        with self._cond:
            stops, self._stops = self._stops, []
        for t in stops:
            t.join(timeout_s)
