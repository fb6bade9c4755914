"""Admission control by SLO class: per-class concurrency and queue-time limits, and shedding of
sheddable classes first when every replica is backed up. A shed request gets 429 with
Retry-After; the router never queues without a deadline."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from pools.model import SLOClass
from pools.wire.openai import ApiError
from router.decision import Candidate

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
        self.freed = {name: asyncio.Event() for name in classes}

    @staticmethod
    def overloaded(snapshot: Sequence[Candidate]) -> bool:
        live = [c for c in snapshot if c.endpoint.healthy and not c.load.breaker_open]
        if not live:
            return False
        return min(c.load.waiting + c.load.inflight / 4 for c in live) >= OVERLOAD_WAITING

    def check_overload(self, slo: SLOClass, snapshot: Sequence[Candidate]) -> None:
        if slo.sheddable and self.overloaded(snapshot):
            raise ApiError(429, f"overloaded: {slo.name} requests are shed first; retry later", "rate_limit_error")

    def enter(self, slo: SLOClass) -> bool:
        """Take a slot now if one is free (the common case: no await, no context manager)."""
        limit = self.limits[slo.name]
        if limit is not None and self.inflight[slo.name] >= limit:
            if slo.sheddable:
                raise ApiError(429, f"{slo.name} is at its concurrency limit ({limit}); retry later",
                               "rate_limit_error")
            return False
        self.inflight[slo.name] += 1
        return True

    async def wait(self, slo: SLOClass) -> None:
        """Queue for a slot up to the class's queue-time limit, then take it (or 429)."""
        limit = self.limits[slo.name] or 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (slo.max_queue_ms or DEFAULT_QUEUE_MS) / 1000
        while self.inflight[slo.name] >= limit:
            left = deadline - loop.time()
            if left <= 0:
                raise ApiError(429, f"{slo.name} waited its queue limit for a slot; retry later", "rate_limit_error")
            self.freed[slo.name].clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.freed[slo.name].wait(), left)
        self.inflight[slo.name] += 1

    def leave(self, slo: SLOClass) -> None:
        self.inflight[slo.name] -= 1
        event = self.freed[slo.name]
        if not event.is_set():
            event.set()
