"""One lazy timer per connection for its current deadline (idle between requests, or reading a
request): re-arming only moves the deadline; the timer re-schedules itself when it fires early,
so a keep-alive connection does not cancel and create a timer per request."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Deadline:
    __slots__ = ("_at", "_loop", "_on_expiry", "_timer")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._timer: asyncio.TimerHandle | None = None
        self._at = 0.0
        self._on_expiry: Callable[[], None] | None = None

    def arm(self, seconds: float, on_expiry: Callable[[], None]) -> None:
        self._at = self._loop.time() + seconds
        self._on_expiry = on_expiry
        if self._timer is None or self._at < self._timer.when():
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._loop.call_at(self._at, self._fire)

    def disarm(self) -> None:
        self._on_expiry = None

    def cancel(self) -> None:
        """For good: the connection is gone (drops the callback, which refers back to it)."""
        self._on_expiry = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        if self._on_expiry is None:
            return
        if self._loop.time() < self._at:
            self._timer = self._loop.call_at(self._at, self._fire)
            return
        on_expiry, self._on_expiry = self._on_expiry, None
        on_expiry()
