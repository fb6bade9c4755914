"""Run a server until SIGTERM/SIGINT, printing its ready line first (engines and the router)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import signal
from collections.abc import Awaitable, Callable

PR_SET_PDEATHSIG = 1
try:
    _PRCTL: Callable[..., int] | None = ctypes.CDLL(None, use_errno=True).prctl  # looked up before any fork
except (OSError, AttributeError):  # not Linux
    _PRCTL = None


def follow_parent(sig: int) -> bool:
    """Ask for `sig` when the thread that started this process ends (Linux PR_SET_PDEATHSIG; kept
    across exec). Only a system call: safe between fork and exec (preexec_fn). False where the
    system has no such call."""
    return _PRCTL is not None and _PRCTL(PR_SET_PDEATHSIG, int(sig)) == 0


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
