"""Admission control by SLO class: per-class concurrency and queue-time limits, and shedding of
sheddable classes first when every replica is backed up. A shed request gets 429 with
Retry-After; the router never queues without a deadline. Waiting is first come, first served
within a class: a freed slot goes to the class's longest waiter, never to a newer arrival."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Sequence

from pools.model import SLOClass
from router.plugins.filters import has_headroom, healthy, serves_class, usable
from router.plugins.model import Candidate, RouteRequest
from wire.errors import ApiError

OVERLOAD_WAITING = 8.0
"""Requests waiting per replica (engine queue + a quarter of the router's in-flight) at which
the cluster counts as overloaded for sheddable classes."""
DEFAULT_QUEUE_MS = 2000.0


class Admission:
    def __init__(self, classes: dict[str, SLOClass], share: int = 1) -> None:
        """`share`: the router's worker processes; each admits its part of a class's limit."""
        self.classes = classes
        self.limits = {name: None if c.max_concurrency is None else max(1, -(-c.max_concurrency // share))
                       for name, c in classes.items()}
        self.inflight = {name: 0 for name in classes}
        self.waiters: dict[str, deque[asyncio.Future[None]]] = {name: deque() for name in classes}
        """Each class's queue for a slot, oldest first."""

    @staticmethod
    def overloaded(snapshot: Sequence[Candidate]) -> bool:
        """Every replica the router may send to (the routing plugins' health rule) is backed up."""
        live = [c for c in snapshot if healthy(c)]
        if not live:
            return False
        return min(c.load.waiting + c.load.inflight / 4 for c in live) >= OVERLOAD_WAITING

    def check_overload(self, slo: SLOClass, snapshot: Sequence[Candidate]) -> None:
        if slo.sheddable and self.overloaded(snapshot):
            raise ApiError(429, f"overloaded: {slo.name} requests are shed first; retry later", "rate_limit_error",
                           cause="overloaded")

    @staticmethod
    def check_headroom(req: RouteRequest, snapshot: Sequence[Candidate], roles: Sequence[str] = ("mixed", "decode")
                       ) -> None:
        """429 when every replica that would hold the request's sequences (its model, `roles`,
        usable, its class's pool) is at the class's share of its sequence slots
        (`filters.has_headroom`): the rest is kept for higher classes. No such replica at all:
        routing answers for it."""
        if req.seq_share >= 1.0:
            return
        full = 0
        for c in snapshot:
            if c.endpoint.model != req.model or c.endpoint.role not in roles:
                continue
            if not usable(c, req.slo_class.sheddable) or not serves_class(req, c):
                continue
            if has_headroom(req, c):
                return
            full += 1
        if full:
            name = req.slo_class.name
            raise ApiError(429, f"{name} requests may fill {req.seq_share:.0%} of a replica's sequence slots and the "
                                f"{full} replicas that serve them are there now (the rest is kept for higher "
                                "classes); retry later", "rate_limit_error", cause="reserved_capacity")

    def enter(self, slo: SLOClass) -> bool:
        """Take a slot now if one is free and nobody waits for it (the common case: no await, no
        context manager); False: queue with `wait`."""
        name = slo.name
        limit = self.limits[name]
        if limit is None:
            self.inflight[name] += 1
            return True
        if self.inflight[name] < limit and not self.waiters[name]:
            self.inflight[name] += 1
            return True
        if slo.sheddable:
            raise ApiError(429, f"{name} is at its concurrency limit ({limit}); retry later", "rate_limit_error",
                           cause="concurrency_limit")
        return False

    async def wait(self, slo: SLOClass) -> None:
        """Queue for a slot, first come first served within the class: a freed slot goes to the
        longest waiter (`leave` hands it over), up to the class's queue-time limit (then 429)."""
        name = slo.name
        slot: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters[name].append(slot)
        try:
            await asyncio.wait_for(asyncio.shield(slot), (slo.max_queue_ms or DEFAULT_QUEUE_MS) / 1000)
        except TimeoutError:
            if slot.done():  # handed over as the time ran out: it is ours
                return
            self._drop(name, slot)
            raise ApiError(429, f"{name} waited its queue limit for a slot; retry later", "rate_limit_error",
                           cause="queue_timeout") from None
        except asyncio.CancelledError:  # the client left while it waited
            if slot.done():
                self.leave(slo)  # a slot was handed to it: pass it on
            else:
                self._drop(name, slot)
            raise

    def _drop(self, name: str, slot: asyncio.Future[None]) -> None:
        slot.cancel()
        with contextlib.suppress(ValueError):
            self.waiters[name].remove(slot)

    def leave(self, slo: SLOClass) -> None:
        """Give the slot back, or straight to the longest waiter of the class."""
        waiters = self.waiters[slo.name]
        while waiters:
            slot = waiters.popleft()
            if not slot.done():
                slot.set_result(None)  # the slot changes hands: in-flight stays as it is
                return
        self.inflight[slo.name] -= 1

    def queued(self, name: str) -> int:
        return len(self.waiters[name])
