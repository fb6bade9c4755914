"""The router's upstream side as a raw asyncio Protocol with httptools: one keep-alive connection
pool per replica, the response head awaited once, and body bytes handed to a sink as they
arrive — no task, no future and no await per chunk. This is the hot path of every request.

    UpstreamError   nothing usable came back before the first byte (connect refused, reset,
                    timeout, bad HTTP): the request may go to another replica
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import httptools

from router.upstream import UpstreamError

Sink = Callable[[bytes], None]


class Exchange:
    """One request and its response on one upstream connection."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.head: asyncio.Future[None] = loop.create_future()
        self.done: asyncio.Future[None] = loop.create_future()
        self.status = 0
        self.headers: dict[str, str] = {}
        self.parts: list[bytes] = []
        self.sink: Sink | None = None
        self.last_data = time.monotonic()
        self.conn: UpstreamProtocol | None = None

    def fail(self, error: Exception) -> None:
        for fut in (self.head, self.done):
            if not fut.done():
                fut.set_exception(error)
                fut.exception()  # mark retrieved: a failed head may never be awaited for its body

    def body(self) -> bytes:
        return b"".join(self.parts)

    def abort(self) -> None:
        """Stop relaying (client gone, idle timeout): the connection cannot be reused."""
        if self.conn is not None and not self.done.done():
            self.conn.close()


class UpstreamProtocol(asyncio.Protocol):
    def __init__(self, pool: RelayPool, key: str) -> None:
        self.pool, self.key = pool, key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.exchange: Exchange | None = None
        self.closed = False
        self._name = b""

    # asyncio
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        if self.exchange is not None:
            self.exchange.fail(UpstreamError(f"{self.key} closed the connection"))
            self.exchange = None

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.exchange is not None:
                self.exchange.fail(UpstreamError(f"{self.key} sent malformed HTTP"))
            self.close()

    # httptools
    def on_header(self, name: bytes, value: bytes) -> None:
        if self.exchange is not None:
            self.exchange.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        ex = self.exchange
        if ex is not None:
            ex.status = self.parser.get_status_code()
            if not ex.head.done():
                ex.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        ex = self.exchange
        if ex is None:
            return
        ex.last_data = time.monotonic()
        if ex.sink is not None:
            ex.sink(body)
        else:
            ex.parts.append(body)

    def on_message_complete(self) -> None:
        ex, self.exchange = self.exchange, None
        keep = self.parser.should_keep_alive()
        if ex is not None and not ex.done.done():
            ex.done.set_result(None)
        if keep and not self.closed:
            self.parser = httptools.HttpResponseParser(self)
            self.pool.put(self)
        else:
            self.close()

    # use
    def send(self, raw: bytes, exchange: Exchange) -> None:
        exchange.conn = self
        self.exchange = exchange
        assert self.transport is not None
        self.transport.write(raw)

    def pause(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.transport.close()
        self.closed = True


class RelayPool:
    def __init__(self, connect_timeout_s: float = 2.0, max_idle_per_host: int = 256) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.max_idle = max_idle_per_host
        self.idle: dict[str, list[UpstreamProtocol]] = {}

    def put(self, conn: UpstreamProtocol) -> None:
        bucket = self.idle.setdefault(conn.key, [])
        if len(bucket) < self.max_idle:
            bucket.append(conn)
        else:
            conn.close()

    def forget(self, conn: UpstreamProtocol) -> None:
        bucket = self.idle.get(conn.key)
        if bucket and conn in bucket:
            bucket.remove(conn)

    async def _connect(self, key: str) -> UpstreamProtocol:
        host, _, port = key.rpartition(":")
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, proto = await loop.create_connection(lambda: UpstreamProtocol(self, key), host, int(port))
        except (OSError, TimeoutError) as err:
            raise UpstreamError(f"cannot connect to {key} ({type(err).__name__})") from None
        return proto

    async def start(self, base: str, method: str, path: str, body: bytes, extra_headers: bytes,
                    first_byte_timeout_s: float, sink: Sink | None = None) -> Exchange:
        """Send; return once the response head is in (status and headers). The body then flows
        to `sink` (or collects in `Exchange.parts`) until `Exchange.done`."""
        key = base.removeprefix("http://")
        raw = (f"{method} {path} HTTP/1.1\r\nhost: {key}\r\ncontent-length: {len(body)}\r\n".encode()
               + extra_headers + b"\r\n" + body)
        loop = asyncio.get_running_loop()
        for attempt in range(2):  # a pooled connection the engine closed meanwhile: one fresh retry
            bucket = self.idle.get(key)
            reused = attempt == 0 and bool(bucket)
            conn = bucket.pop() if reused and bucket else await self._connect(key)
            exchange = Exchange(loop)
            exchange.sink = sink
            conn.send(raw, exchange)
            late = UpstreamError(f"no response from {key} within {first_byte_timeout_s:g} s")
            timer = loop.call_later(first_byte_timeout_s, _too_late, exchange, conn, late)
            try:
                await exchange.head
            except UpstreamError as err:
                if reused and err is not late:
                    continue
                raise
            except BaseException:  # cancelled (the client left): the engine's request stops with the connection
                conn.close()
                raise
            finally:
                timer.cancel()
            return exchange
        raise UpstreamError(f"{key} closed the connection twice")

    def close(self) -> None:
        for bucket in self.idle.values():
            for conn in list(bucket):
                conn.close()
        self.idle.clear()


def _too_late(exchange: Exchange, conn: UpstreamProtocol, error: UpstreamError) -> None:
    if not exchange.head.done():
        exchange.fail(error)
        conn.close()


async def finish(exchange: Exchange, idle_timeout_s: float) -> None:
    """Wait for the body to end; a gap longer than the idle timeout aborts it."""
    if exchange.done.done():  # small bodies are usually complete with their head
        exchange.done.result()
        return
    while True:
        left = exchange.last_data + idle_timeout_s - time.monotonic()
        if left <= 0:
            exchange.abort()
            raise UpstreamError("upstream went quiet mid-response")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(left, idle_timeout_s)):
                await asyncio.shield(exchange.done)
                return
