"""A lean HTTP/1.1 server on asyncio + httptools: keep-alive, request bodies, full responses and
chunked streaming with flow control, client-disconnect notice. The simulated engine and the
router both serve through it (one data plane, no framework on the hot path).

    async def handler(request: Request, response: Responder) -> None: ...
    server = await serve(handler, "127.0.0.1", 8000)
"""

from __future__ import annotations

__all__ = ["Handler", "HttpProtocol", "Request", "Responder", "serve"]

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

import httptools

from pools.wire.responder import Responder, _header_block, _status_line

MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_HEADER_COUNT = 100
MAX_HEAD_BYTES = 64 * 1024
"""Request line plus headers; past either limit the request is answered 431."""
MAX_PIPELINED = 16
"""Requests parsed ahead of the one being answered; past this the connection stops reading."""
IDLE_TIMEOUT_S = 75.0
"""A keep-alive connection with no request in progress is closed after this long."""
READ_TIMEOUT_S = 30.0
"""A request whose headers and body have not all arrived after this long is answered 408."""


@dataclass(slots=True)
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    """Lower-case names; a repeated header keeps its last value."""
    body: bytes
    peer: str


@dataclass(slots=True)
class _Incoming:
    url: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    body: list[bytes] = field(default_factory=list)
    size: int = 0
    too_large: bool = False


def _error(status: int, message: str) -> bytes:
    """An error body in OpenAI's shape, for what the server refuses before any handler runs."""
    return (b'{"error": {"message": "%b", "type": "invalid_request_error", "param": null, "code": %d}}'
            % (message.encode(), status))


_MALFORMED = _error(400, "malformed HTTP request")
_UPGRADE = _error(400, "protocol upgrades are not supported")
_TOO_LARGE = _error(413, "request body too large")
_HEAD_TOO_LARGE = _error(431, f"request headers too large (at most {MAX_HEADER_COUNT} headers, {MAX_HEAD_BYTES} bytes)")
_NOT_IN_TIME = _error(408, "request not received in time")


Handler = Callable[[Request, Responder], Awaitable[None] | None]
"""Either a coroutine function, or a plain function that answers through `Responder` — now or
later from callbacks — and returns None (or a coroutine for the part that has to wait)."""


class HttpProtocol(asyncio.Protocol):
    def __init__(self, handler: Handler, on_error: Callable[[BaseException], None] | None = None,
                 read_timeout_s: float | None = None, max_body_bytes: int | None = None) -> None:
        self.handler = handler
        self.on_error = on_error
        self.read_timeout_s = READ_TIMEOUT_S if read_timeout_s is None else read_timeout_s
        self.max_body_bytes = MAX_BODY_BYTES if max_body_bytes is None else max_body_bytes
        self.loop = asyncio.get_running_loop()  # (asking for it each time costs a getpid() before 3.12)
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.incoming = _Incoming()
        self.queue: list[tuple[Request, bool, bool]] = []
        self.busy = False
        self.closed = False
        self.peer = ""
        self._paused = False
        self._drain: asyncio.Future[None] | None = None
        self.resume_callbacks: list[Callable[[], None]] = []
        self.task: asyncio.Task[None] | None = None
        self.on_disconnect: Callable[[], None] | None = None
        self._pending_reject: tuple[int, bytes] | None = None
        self._reading_paused = False
        self._timer: asyncio.TimerHandle | None = None
        self._deadline = 0.0
        self._on_expiry: Callable[[], None] | None = None
        self._in_head = False
        self._head_bytes = 0
        """Bytes of the request line and header names and values parsed so far."""
        self._head_raw = 0
        """Bytes received while a head is still incomplete (the parser holds them)."""
        self._head_too_large = False

    # timers: idle between requests, read while a request arrives. One lazy timer per connection:
    # re-arming only moves a deadline, the timer re-schedules itself when it fires early.
    def _arm(self, seconds: float, on_expiry: Callable[[], None]) -> None:
        loop = self.loop
        self._deadline = loop.time() + seconds
        self._on_expiry = on_expiry
        if self._timer is None or self._deadline < self._timer.when():
            if self._timer is not None:
                self._timer.cancel()
            self._timer = loop.call_at(self._deadline, self._fire)

    def _disarm(self) -> None:
        self._on_expiry = None

    def _fire(self) -> None:
        self._timer = None
        if self.closed or self._on_expiry is None:
            return
        loop = self.loop
        if loop.time() < self._deadline:
            self._timer = loop.call_at(self._deadline, self._fire)
            return
        on_expiry, self._on_expiry = self._on_expiry, None
        on_expiry()

    def _idle_expired(self) -> None:
        if not self.busy and not self.queue and self.transport is not None and not self.closed:
            self.transport.close()
            self.closed = True

    def _read_expired(self) -> None:
        self._reject(408, _NOT_IN_TIME)

    # asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not an asyncio.Transport subclass
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else ""
        self._arm(IDLE_TIMEOUT_S, self._idle_expired)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._wake()
        if self.task is not None and not self.task.done():
            self.task.cancel()  # the client went away: stop the work it asked for
        hook, self.on_disconnect = self.on_disconnect, None
        if hook is not None and self.busy:
            hook()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake()
        callbacks, self.resume_callbacks = self.resume_callbacks, []
        for callback in callbacks:
            callback()

    @property
    def paused(self) -> bool:
        return self._paused

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._reject(400, _UPGRADE)
            return
        except httptools.HttpParserError:
            self._reject(400, _MALFORMED)
            return
        if self._in_head:  # a head still arriving: the parser buffers it, so bound what it holds
            self._head_raw += len(data)
            if self._head_raw > MAX_HEAD_BYTES:
                self._in_head = False
                self._reject(431, _HEAD_TOO_LARGE)

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.incoming = _Incoming()
        self._in_head, self._head_bytes, self._head_raw, self._head_too_large = True, 0, 0, False
        self._arm(self.read_timeout_s, self._read_expired)

    def on_url(self, url: bytes) -> None:
        self.incoming.url += url
        self._head_bytes += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value)
        headers = self.incoming.headers
        if len(headers) < MAX_HEADER_COUNT and self._head_bytes <= MAX_HEAD_BYTES:
            headers[name.decode("latin-1").lower()] = value.decode("latin-1")
        else:
            self._head_too_large = True

    def on_headers_complete(self) -> None:
        self._in_head = False
        expect = self.incoming.headers.get("expect")
        if expect is not None and expect.lower() == "100-continue":
            self.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl waits a second for this before a large body

    def on_body(self, body: bytes) -> None:
        self.incoming.size += len(body)
        if self.incoming.size > self.max_body_bytes:
            self.incoming.too_large = True
        else:
            self.incoming.body.append(body)

    def on_message_complete(self) -> None:
        self._disarm()
        inc = self.incoming
        if inc.too_large or self._head_too_large:
            self._reject(413 if inc.too_large else 431, _TOO_LARGE if inc.too_large else _HEAD_TOO_LARGE)
            return
        url = inc.url.decode("latin-1")
        if url.startswith("/") and "?" not in url and "#" not in url:
            path, query = url, {}  # the common case: a plain origin-form path
        else:
            parts = urlsplit(url)
            path, query = parts.path, parse_qs(parts.query)
        method = self.parser.get_method().decode()
        body = inc.body[0] if len(inc.body) == 1 else b"".join(inc.body)
        request = Request(method="GET" if method == "HEAD" else method, path=path, query=query, headers=inc.headers,
                          body=body, peer=self.peer)
        self.queue.append((request, self.parser.should_keep_alive(), method == "HEAD"))
        if len(self.queue) >= MAX_PIPELINED and self.transport is not None and not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()
        self._next()

    # internals
    def _reject(self, status: int, body: bytes) -> None:
        """Answer and close; behind pipelined requests still being answered, after them, in order."""
        if self.busy or self.queue:
            if self._pending_reject is None:
                self._pending_reject = (status, body)
                if self.transport is not None and not self._reading_paused:
                    self._reading_paused = True
                    self.transport.pause_reading()
            return
        self._disarm()
        if self.transport is not None and not self.closed:
            head = _status_line(status) + _header_block(
                [("content-type", "application/json"), ("content-length", str(len(body))), ("connection", "close")])
            self.transport.write(head + b"\r\n" + body)
            self.transport.close()
        self.closed = True

    def _next(self) -> None:
        if self.busy or self.closed:
            return
        if not self.queue:
            if self._pending_reject is not None:
                self._reject(*self._pending_reject)
            else:
                self._arm(IDLE_TIMEOUT_S, self._idle_expired)
            return
        if self._reading_paused and self._pending_reject is None and len(self.queue) <= MAX_PIPELINED // 2 \
                and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()
        request, keep_alive, head_only = self.queue.pop(0)
        self.busy = True
        responder = Responder(self, keep_alive, head_only)
        self.task = None
        try:
            pending = self.handler(request, responder)
        except Exception as err:
            self._failed(responder, err)
            return
        if pending is not None:
            self.task = self.loop.create_task(self._run(pending, responder))

    def _failed(self, responder: Responder, err: Exception) -> None:
        """A handler bug must not take the connection's other requests down."""
        if self.on_error is not None:
            self.on_error(err)
        if not responder.started:
            responder.send(500, b'{"error": {"message": "internal error", "type": "server_error", "code": 500}}')
        elif not responder.finished and self.transport is not None:
            self.transport.close()

    async def _run(self, pending: Awaitable[None], responder: Responder) -> None:
        try:
            await pending
        except asyncio.CancelledError:
            return
        except Exception as err:
            self._failed(responder, err)
            return
        if not responder.finished:
            if responder.started:
                responder.end()
            else:
                responder.send(500, b'{"error": {"message": "no response", "type": "server_error", "code": 500}}')

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    async def drain(self) -> None:
        if self._paused and not self.closed:
            loop = asyncio.get_running_loop()
            self._drain = loop.create_future()
            await self._drain

    def _wake(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def response_done(self, keep_alive: bool) -> None:
        self.busy = False
        self.on_disconnect = None
        if not keep_alive and self.transport is not None:
            self.transport.close()
            self.closed = True
            return
        if self.queue or self._pending_reject is not None:
            self.loop.call_soon(self._next)  # after the current handler has returned
        else:
            self._arm(IDLE_TIMEOUT_S, self._idle_expired)


async def serve(handler: Handler, host: str, port: int, reuse_port: bool = False,
                on_error: Callable[[BaseException], None] | None = None, read_timeout_s: float | None = None,
                max_body_bytes: int | None = None) -> asyncio.Server:
    """`read_timeout_s`: a request's head and body must arrive within it (else 408; default
    READ_TIMEOUT_S); `max_body_bytes`: larger bodies are read, dropped and answered 413 (default
    MAX_BODY_BYTES)."""
    loop = asyncio.get_running_loop()
    # asyncio and uvloop set TCP_NODELAY on accepted TCP sockets: no Nagle stall on SSE chunks.
    return await loop.create_server(lambda: HttpProtocol(handler, on_error, read_timeout_s, max_body_bytes), host, port,
                                    reuse_port=reuse_port, backlog=1024)


async def serve_unix(handler: Handler, path: str, on_error: Callable[[BaseException], None] | None = None,
                     max_body_bytes: int | None = None) -> asyncio.Server:
    """The same HTTP/1.1 server on a Unix socket (a process's private channel to its siblings:
    only processes that can open `path` reach it)."""
    loop = asyncio.get_running_loop()
    return await loop.create_unix_server(lambda: HttpProtocol(handler, on_error, None, max_body_bytes), path,
                                         backlog=64)
