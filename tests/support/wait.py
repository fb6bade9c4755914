"""The one poll loop the tests use: ask until the answer is yes, or fail saying what never came.

A deadline here only bounds how long a broken build takes to fail (it is generous, and no test
asserts how long anything took through it)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

START_S = 180.0
"""The deadline for something that starts processes through Ray: a replica or its replacement, an
engine restarted by its actor, a gang, a controller back after a kill, a deploy. One such start
took 4-7 s on a quiet 2-core machine, 15-35 s beside the unit lane, and past 60 s once in CI's
four lanes at once (2026-12-07, where a 60 s deadline failed a replacement that was on its way)."""


class NeverHappened(AssertionError):
    """What a test waited for did not come before its deadline."""


def _described(err: BaseException) -> str:
    """What an ignored exception said, without keeping it: a kept exception holds its traceback,
    whose frames hold it (a cycle), and with them whatever the failed probe had open (an HTTP
    error's unread response) until the garbage collector runs, in some later test."""
    close = getattr(err, "close", None)  # urllib's HTTPError is also the response
    if callable(close):
        close()
    return f"{type(err).__name__}: {err}"


def _failed(what: str, timeout_s: float, last: object) -> NeverHappened:
    return NeverHappened(f"{what}: not within {timeout_s:g} s (last seen: {last!r})")


def wait_until(check: Callable[[], T | None], timeout_s: float, what: str, interval_s: float = 0.05,
               ignore: tuple[type[BaseException], ...] = (), seen: Callable[[], object] | None = None) -> T:
    """`check()`'s first true answer, asked every `interval_s` until `timeout_s` passes; then
    fail naming `what` and the last answer (or what `seen()` says then). Exceptions of the types
    in `ignore` (a server still starting, a Ray actor being restarted) count as "not yet"."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            got = check()
        except ignore as err:
            last = _described(err)
        else:
            if got:
                return got
            last = got
        if time.monotonic() >= deadline:
            raise _failed(what, timeout_s, last if seen is None else seen())
        time.sleep(interval_s)


async def wait_until_async(check: Callable[[], T | Awaitable[T | None] | None], timeout_s: float, what: str,
                           interval_s: float = 0.05, ignore: tuple[type[BaseException], ...] = ()) -> T:
    """`wait_until` inside an event loop: `check` may be a plain call or a coroutine function,
    and the loop keeps running between asks."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            got = check()
            if isinstance(got, Awaitable):
                got = await got
        except ignore as err:
            last = _described(err)
        else:
            if got:
                return got
            last = got
        if time.monotonic() >= deadline:
            raise _failed(what, timeout_s, last)
        await asyncio.sleep(interval_s)
