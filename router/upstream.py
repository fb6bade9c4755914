"""The router's upstream vocabulary outside the relay itself: the request path's error, and the
client the router scrapes its engines' /metrics with (off the request path: requests go through
router.relay's own connections).

    UpstreamError     nothing usable came back (connect refused, reset, timeout, bad HTTP):
                      the request may be retried on another replica, no byte went to the client
    Unreachable       the UpstreamError of a connection that could not be made: the engine
                      never saw the request (a stopped engine's port refuses it)
    Pool              keep-alive scrape clients, one per engine URL (wire.client), each
                      call bounded by a connect and a read timeout; a failure is an UpstreamError
                      (also the prefix-cache index's /tokenize calls, `router.kvtokens`)
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection
from typing import Any

from wire.client import AsyncClient, ClientError


class UpstreamError(Exception):
    pass


class Unreachable(UpstreamError):
    """No connection to the engine could be made: nothing of the request reached it."""


class Pool:
    def __init__(self, connect_timeout_s: float = 2.0, timeout_s: float = 2.0, key: str = "") -> None:
        self.connect_timeout_s, self.timeout_s, self.key = connect_timeout_s, timeout_s, key or None
        self.clients: dict[str, AsyncClient] = {}

    async def text(self, base: str, path: str) -> str:
        """The body of a 2xx answer to GET `base + path`."""
        try:
            return await self._client(base).get_text(path)
        except ClientError as err:
            raise UpstreamError(str(err)) from None

    async def post_json(self, base: str, path: str, body: bytes) -> tuple[int, Any]:
        """(status, JSON of a 2xx answer, else None) to POST `base + path` with the JSON `body`."""
        try:
            client = self._client(base)
            reply = await client.request("POST", path, content=body, headers={"content-type": "application/json"})
            return reply.status, reply.json() if reply.ok else None
        except ClientError as err:
            raise UpstreamError(str(err)) from None

    def _client(self, base: str) -> AsyncClient:
        client = self.clients.get(base)
        if client is None:
            client = self.clients[base] = AsyncClient(base, key=self.key, timeout_s=self.timeout_s, max_idle=1,
                                                      connect_timeout_s=self.connect_timeout_s)
        return client

    async def keep(self, bases: Collection[str]) -> None:
        """Close the clients of engines no longer scraped (a restart moved them to another port)."""
        gone = [b for b in self.clients if b not in bases]
        await _close_all([self.clients.pop(b) for b in gone])

    async def aclose(self) -> None:
        clients, self.clients = list(self.clients.values()), {}
        await _close_all(clients)


async def _close_all(clients: list[AsyncClient]) -> None:
    for client in clients:
        with contextlib.suppress(Exception):
            await client.aclose()
