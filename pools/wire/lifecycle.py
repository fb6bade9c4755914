"""Run a server until SIGTERM/SIGINT, printing its ready line first (engines and the router)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable


async def serve_until_signalled(start: Callable[[], Awaitable[None]], stop: Callable[[], Awaitable[None]],
                                ready_line: Callable[[], str]) -> None:
    await start()
    print(ready_line(), flush=True)
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, done.set)
    await done.wait()
    await stop()
