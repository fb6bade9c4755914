"""The live drivers' client: keep-alive connections to one loopback target (wire.client's
AsyncClient, httpx underneath), each piece of a streamed body handed on with the time it was
read, so a token's time is when its bytes arrived."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import orjson

from wire.client import AsyncClient, Stream, is_loopback, origin


class UsageError(Exception):
    """A command line we refuse (exit 2): a non-loopback target, a bad workload or classes file."""


def loopback_target(url: str) -> tuple[str, int]:
    """(host, port) of an http://HOST:PORT[/v1] URL whose host is a loopback address."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme != "http":
        raise UsageError(f"target {url!r}: only http:// targets are supported")
    host = parts.hostname or ""
    if not is_loopback(host):
        raise UsageError(f"refusing target {url!r}: host {host or '(none)'} is not a loopback address "
                         "(127.0.0.0/8, ::1 or localhost); load tests only run against this machine")
    try:
        port = parts.port or 80
    except ValueError:
        raise UsageError(f"target {url!r}: bad port") from None
    return host, port


class Target:
    """Keep-alive connections to one host:port: one single-connection AsyncClient per stream in
    flight, kept for the next request when it is done (httpx's own pool looks at every
    connection it holds for every request it sends: at hundreds of streams that is most of the
    client's CPU). No timeout of its own: the drivers bound each request by its deadline. Errors
    are wire.client's (OSErrors; `kind` names the cause)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.base = origin(host, port)
        self.idle: list[AsyncClient] = []
        self.clients: list[AsyncClient] = []

    def _client(self) -> AsyncClient:
        if self.idle:
            return self.idle.pop()
        client = AsyncClient(self.base, timeout_s=None, max_idle=1)
        self.clients.append(client)
        return client

    @contextlib.asynccontextmanager
    async def post(self, path: str, body: bytes, headers: Mapping[str, str]) -> AsyncIterator[Stream]:
        """The answer once its head is read; its body through `body`."""
        client = self._client()
        try:
            async with client.stream("POST", path, content=body, headers=headers) as answer:
                yield answer
        finally:
            self.idle.append(client)  # its connection stays open only if the answer was read to its end

    @staticmethod
    async def body(answer: Stream, sink: Callable[[bytes, float], None]) -> None:
        """Hand each piece of the body to `sink` with the time it was read."""
        async for piece in answer.chunks():
            sink(piece, time.perf_counter())

    async def get_json(self, path: str, key: str) -> tuple[int, Any]:
        """(status, the body as JSON or None)."""
        client = self._client()
        try:
            reply = await client.request("GET", path, headers={"authorization": f"Bearer {key}"})
        finally:
            self.idle.append(client)
        try:
            return reply.status, orjson.loads(reply.body)
        except orjson.JSONDecodeError:
            return reply.status, None

    async def aclose(self) -> None:
        clients, self.clients, self.idle = self.clients, [], []
        for client in clients:
            await client.aclose()
