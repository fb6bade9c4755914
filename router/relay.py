"""The router's upstream side as a raw asyncio Protocol with httptools: one keep-alive connection
pool per replica; a response is reported to a listener as plain callbacks (head, body pieces,
done, error) — no task, no future and no await per request or per chunk. This is the hot path.

    UpstreamError   nothing usable came back before the first byte (connect refused, reset,
                    timeout, bad HTTP): the request may go to another replica

`Exchange` adapts the callbacks to awaitables for the few callers that are coroutines (the
prefill leg of a PD request, releasing held KV).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Protocol

import httptools

from router.upstream import Unreachable, UpstreamError


class Listener(Protocol):
    conn: UpstreamProtocol | None
    """Set when the request goes out on a connection (pause, resume, abort go through it)."""

    def on_head(self, status: int, content_type: str) -> None: ...

    def on_body(self, data: bytes) -> None: ...

    def on_done(self) -> None: ...

    def on_error(self, error: UpstreamError) -> None: ...

    def flush(self) -> None:
        """After each read from the engine: what `on_body` gathered goes out (one write per read,
        not one per chunk, when the engine's chunks come together)."""


class UpstreamProtocol(asyncio.Protocol):
    def __init__(self, pool: RelayPool, key: str) -> None:
        self.pool, self.key = pool, key
        self.transport: asyncio.Transport | None = None
        self.parser: Any = httptools.HttpResponseParser(self)
        self.listener: Listener | None = None
        self.closed = False
        self.reused = False
        self.answered = False
        """A byte of the current response has arrived (a reused connection failing before that
        was closed by the engine while idle: the request is re-sent on a fresh one)."""
        self.raw = b""
        self.content_type = "application/json"

    # asyncio
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.pool.open[self] = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        self.pool.open.pop(self, None)
        self.parser = None  # no parser <-> protocol cycle keeps a closed connection alive
        listener, self.listener = self.listener, None
        if listener is None:
            return
        if self.reused and not self.answered and not self.pool.closing:
            self.pool.send_fresh(self.key, self.raw, listener)
        else:
            listener.on_error(UpstreamError(f"{self.key} closed the connection"))

    def data_received(self, data: bytes) -> None:
        self.answered = True
        if self.parser is None:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            listener, self.listener = self.listener, None
            self.close()
            if listener is not None:
                listener.on_error(UpstreamError(f"{self.key} sent malformed HTTP"))
            return
        if self.listener is not None:
            self.listener.flush()

    # httptools
    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) == 12 and name.lower() == b"content-type":
            self.content_type = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        if self.listener is not None:
            self.listener.on_head(self.parser.get_status_code(), self.content_type)

    def on_body(self, body: bytes) -> None:
        if self.listener is not None:
            self.listener.on_body(body)

    def on_message_complete(self) -> None:
        listener, self.listener = self.listener, None
        if self.parser.should_keep_alive() and not self.closed:  # the parser goes on to the next response
            self.pool.put(self)
        else:
            self.close()
        if listener is not None:
            listener.on_done()

    # use
    def begin(self, raw: bytes, listener: Listener) -> None:
        self.listener, self.raw = listener, raw
        self.answered = False
        self.content_type = "application/json"
        listener.conn = self
        assert self.transport is not None
        self.transport.write(raw)

    def pause(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def abort(self) -> None:
        """The listener is gone (client left, timeout): no more callbacks; the connection cannot
        be reused (the engine's request stops with it)."""
        self.listener = None
        self.close()

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.transport.close()
        self.closed = True


def request_bytes(base: str, method: str, path: str, body: bytes, extra_headers: bytes) -> bytes:
    key = base.removeprefix("http://")
    return b"%s %s HTTP/1.1\r\nhost: %s\r\ncontent-length: %d\r\n%b\r\n%b" % (
        method.encode(), path.encode("latin-1"), key.encode(), len(body), extra_headers, body)


JSON_HEADERS = b"content-type: application/json\r\nconnection: keep-alive\r\n"


class RelayPool:
    def __init__(self, connect_timeout_s: float = 2.0, max_idle_per_host: int = 256, engine_key: str = "") -> None:
        """`engine_key`: the key the engines want (vLLM's `--api-key`), sent with every request."""
        self.connect_timeout_s = connect_timeout_s
        self.max_idle = max_idle_per_host
        self.headers = JSON_HEADERS + (b"authorization: Bearer %b\r\n" % engine_key.encode() if engine_key else b"")
        """The headers of every request to an engine (JSON, keep-alive, the engine key)."""
        self.idle: dict[str, list[UpstreamProtocol]] = {}
        self.open: dict[UpstreamProtocol, None] = {}
        """Every connection to an engine, idle or carrying a request (`close` closes them all)."""
        self.closing = False
        """The router is stopping: no request is sent again, and none on a new connection."""
        self._connecting: set[asyncio.Task[None]] = set()

    def put(self, conn: UpstreamProtocol) -> None:
        if self.closing:
            conn.close()
            return
        bucket = self.idle.setdefault(conn.key, [])
        if len(bucket) < self.max_idle:
            conn.reused = True
            bucket.append(conn)
        else:
            conn.close()

    def forget(self, conn: UpstreamProtocol) -> None:
        bucket = self.idle.get(conn.key)
        if bucket and conn in bucket:
            bucket.remove(conn)

    def send(self, base: str, raw: bytes, listener: Listener) -> None:
        """Send on an idle keep-alive connection now, or on a new one once it is connected."""
        key = base.removeprefix("http://")
        bucket = self.idle.get(key)
        if bucket:
            bucket.pop().begin(raw, listener)
        else:
            self.send_fresh(key, raw, listener)

    def send_fresh(self, key: str, raw: bytes, listener: Listener) -> None:
        listener.conn = None
        if self.closing:
            listener.on_error(Unreachable(f"not sent to {key}: the router is stopping"))
            return
        task = asyncio.get_running_loop().create_task(self._connect_and_send(key, raw, listener))
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)

    async def _connect_and_send(self, key: str, raw: bytes, listener: Listener) -> None:
        host, _, port = key.rpartition(":")
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, proto = await loop.create_connection(lambda: UpstreamProtocol(self, key), host, int(port))
        except (OSError, TimeoutError) as err:
            listener.on_error(Unreachable(f"cannot connect to {key} ({type(err).__name__})"))
            return
        if getattr(listener, "abandoned", False):  # the client left while we were connecting
            self.put(proto)
            return
        proto.begin(raw, listener)

    def close(self) -> None:
        """The router stops: connections being made are given up, and every open one closes, a
        request still on it included: its engine stops it, and its client is answered with the
        error (the request is not sent again)."""
        self.closing = True
        for task in list(self._connecting):
            task.cancel()
        self.idle.clear()
        for conn in list(self.open):
            conn.close()


class Exchange:
    """One request and its response as awaitables: `await RelayPool.start(...)` gives the head;
    the body collects in `parts` (or goes to `sink`) until `done`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.head: asyncio.Future[None] = loop.create_future()
        self.done: asyncio.Future[None] = loop.create_future()
        self.loop = loop
        self.status = 0
        self.content_type = "application/json"
        self.parts: list[bytes] = []
        self.last_data = loop.time()
        self.conn: UpstreamProtocol | None = None
        self.abandoned = False

    def on_head(self, status: int, content_type: str) -> None:
        self.status, self.content_type = status, content_type
        if not self.head.done():
            self.head.set_result(None)

    def on_body(self, data: bytes) -> None:
        self.last_data = self.loop.time()
        self.parts.append(data)

    def flush(self) -> None:
        pass

    def on_done(self) -> None:
        if not self.head.done():
            self.head.set_result(None)
        if not self.done.done():
            self.done.set_result(None)

    def on_error(self, error: UpstreamError) -> None:
        for fut in (self.head, self.done):
            if not fut.done():
                fut.set_exception(error)
                fut.exception()  # mark retrieved: a failed head may never be awaited for its body

    def body(self) -> bytes:
        return b"".join(self.parts)

    def abort(self) -> None:
        """Stop (client gone, timeout): the connection cannot be reused."""
        self.abandoned = True
        if self.conn is not None and not self.done.done():
            self.conn.abort()


async def start(pool: RelayPool, base: str, path: str, body: bytes, extra_headers: bytes,
                first_byte_timeout_s: float) -> Exchange:
    """POST and return once the response head is in; the body then collects until `done`."""
    exchange = Exchange(asyncio.get_running_loop())
    pool.send(base, request_bytes(base, "POST", path, body, extra_headers), exchange)
    try:
        async with asyncio.timeout(first_byte_timeout_s):
            await asyncio.shield(exchange.head)
    except TimeoutError:
        exchange.abort()
        raise UpstreamError(f"no response from {base.removeprefix('http://')} within "
                            f"{first_byte_timeout_s:g} s") from None
    except BaseException:  # cancelled (the client left): the engine's request stops with the connection
        exchange.abort()
        raise
    return exchange


async def finish(exchange: Exchange, idle_timeout_s: float) -> None:
    """Wait for the body to end; a gap longer than the idle timeout aborts it."""
    if exchange.done.done():  # small bodies are usually complete with their head
        exchange.done.result()
        return
    while True:
        left = exchange.last_data + idle_timeout_s - exchange.loop.time()
        if left <= 0:
            exchange.abort()
            raise UpstreamError("upstream went quiet mid-response")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(left, idle_timeout_s)):
                await asyncio.shield(exchange.done)
                return
