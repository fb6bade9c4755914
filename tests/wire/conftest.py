"""The wire package's test kit: the HTTP server on a free loopback port with a test's handler,
for the length of one scenario (a coroutine given the port and the server's limits)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from wire import http
from wire.limits import ServerLimits
from wire.reader import Request
from wire.responder import Responder

Handler = Callable[[Request, Responder], Awaitable[None]]
Scenario = Callable[[int, ServerLimits], Awaitable[None]]


def run_server(handler: Handler, scenario: Scenario, limits: ServerLimits, timeout_s: float,
               **serve: Any) -> None:
    """Serve `handler` (wire.http.serve with `limits` and `serve`'s other settings) while
    `scenario(port, limits)` runs, at most `timeout_s`; then close the server."""
    async def main() -> None:
        server = await http.serve(handler, "127.0.0.1", 0, limits=limits, **serve)
        port = server.sockets[0].getsockname()[1]
        try:
            await asyncio.wait_for(scenario(port, limits), timeout_s)
        finally:
            server.close()
    asyncio.run(main())
