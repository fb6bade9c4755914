"""A lean HTTP/1.1 server on asyncio + httptools: keep-alive, request bodies, full responses and
chunked streaming with flow control, client-disconnect notice. The simulated engine and the
router both serve through it (one data plane, no framework on the hot path).

    async def handler(request: Request, response: Responder) -> None: ...
    server = await serve(handler, "127.0.0.1", 8000)

Connection semantics, as nginx and Envoy have them:
- One request at a time. The parser is fed only up to the end of the request in hand (the
  first CRLF CRLF of a head or a chunked body, or the declared length); what a pipelining
  client sent after it waits, unparsed, with reading paused, until the response has been
  handed to the socket and the socket has drained below its high-water mark. So pipelined
  requests wait in the client's socket, at most one read of them in memory, and an interim
  `100 Continue` can only belong to the request being served.
- Caps per listener (`pools.wire.limits.ServerLimits`): open connections and buffered request
  bytes (503 + Retry-After past either); a client that leaves its response unread for
  `client_write_timeout_s` is disconnected (`Responder.timed_out` says so to the handler).
- Refused: a head over MAX_HEAD_BYTES / MAX_HEADER_COUNT (431), a body over the limit (413),
  HTTP/1.1 without Host, a repeated Host / Authorization / Content-Length / X-SLO-Class (400),
  a Transfer-Encoding other than `chunked` alone (501), protocol upgrades (400, one response).
  Trailers of a chunked request are read and dropped: they never add to or replace a header.
- A client that half-closes after its request still gets the answer; the connection closes
  after it.
"""

from __future__ import annotations

__all__ = ["Handler", "HttpProtocol", "Request", "Responder", "ServerLimits", "serve"]

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httptools

from pools.wire.limits import ServerLimits
from pools.wire.responder import Responder, header_block, status_line

MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_HEADER_COUNT = 100
MAX_HEAD_BYTES = 64 * 1024
"""Request line plus headers; past either limit the request is answered 431."""
IDLE_TIMEOUT_S = 75.0
"""A keep-alive connection with no request in progress is closed after this long."""
READ_TIMEOUT_S = 30.0
"""A request whose headers and body have not all arrived after this long is answered 408."""
PROBE_S = 0.2
"""After a client's FIN with its answer pending: when the second probe goes (see eof_received)."""
SINGLE = frozenset(("host", "authorization", "content-length", "x-slo-class"))
"""Headers a request may carry once: two of them are ambiguous (which one a gateway in front
checked is unknowable), so they are refused rather than merged or overridden."""

_HEAD, _LENGTH, _CHUNKED = 0, 1, 2
"""Where the parser is in the request at hand: in a head (or between requests), in a body of
known length, in a chunked body."""
_END = b"\r\n\r\n"


@dataclass(slots=True)
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    """Lower-case names; a header sent several times has its values joined with ", " (RFC 9110
    5.3), except those of SINGLE, which a request may carry once."""
    body: bytes
    peer: str
    http_version: str = "1.1"


def _error(status: int, message: str) -> bytes:
    """An error body in OpenAI's shape, for what the server refuses before any handler runs."""
    return (b'{"error": {"message": "%b", "type": "invalid_request_error", "param": null, "code": %d}}'
            % (message.encode(), status))


_MALFORMED = _error(400, "malformed HTTP request")
_UPGRADE = _error(400, "protocol upgrades are not supported")
_NO_HOST = _error(400, "an HTTP/1.1 request needs a Host header")
_TOO_LARGE = _error(413, "request body too large")
_HEAD_TOO_LARGE = _error(431, f"request headers too large (at most {MAX_HEADER_COUNT} headers, {MAX_HEAD_BYTES} bytes)")
_NOT_IN_TIME = _error(408, "request not received in time")
_TRANSFER_CODING = _error(501, "only the chunked transfer coding is supported for request bodies")
_BUSY_CONNECTIONS = _error(503, "too many open connections: retry later")
_BUSY_BYTES = _error(503, "too many request bytes in flight: retry later")
_INTERNAL = b'{"error": {"message": "internal error", "type": "server_error", "code": 500}}'


Handler = Callable[[Request, Responder], Awaitable[None] | None]
"""Either a coroutine function, or a plain function that answers through `Responder` — now or
later from callbacks — and returns None (or a coroutine for the part that has to wait)."""


def _cut(tail: bytes, data: bytes, pos: int) -> int:
    """How many bytes of `data` from `pos` to feed: up to and including the first CRLF CRLF
    (which may start in `tail`, the last bytes fed), or all of them. A request without a body,
    and a chunked body, can only end there."""
    if tail:
        k = (tail + data[pos:pos + 3]).find(_END)
        if k >= 0:
            return k + 4 - len(tail)
    k = data.find(_END, pos)
    return len(data) - pos if k < 0 else k + 4 - pos


class HttpProtocol(asyncio.Protocol):
    def __init__(self, handler: Handler, limits: ServerLimits, on_error: Callable[[BaseException], None] | None = None,
                 read_timeout_s: float | None = None, max_body_bytes: int | None = None) -> None:
        self.handler = handler
        self.limits = limits
        self.on_error = on_error
        self.read_timeout_s = READ_TIMEOUT_S if read_timeout_s is None else read_timeout_s
        self.max_body_bytes = MAX_BODY_BYTES if max_body_bytes is None else max_body_bytes
        self.loop = asyncio.get_running_loop()  # (asking for it each time costs a getpid() before 3.12)
        self.transport: asyncio.Transport | None = None
        self.parser: Any = httptools.HttpRequestParser(self)
        self.closed = False
        self.counted = False
        """This connection counts toward the listener's connection cap."""
        self.peer = ""
        self.busy = False
        """A request has been handed to the handler and its response is not finished."""
        self.held = b""
        """Bytes that arrived while busy, from `held_pos` on: not parsed yet (reading is paused
        meanwhile)."""
        self.held_pos = 0
        self.task: asyncio.Task[None] | None = None
        self.on_disconnect: Callable[[], None] | None = None
        self.resume_callbacks: list[Callable[[], None]] = []
        self.timed_out = False
        self._paused = False
        self._drain: asyncio.Future[None] | None = None
        self._reading_paused = False
        self._eof = False
        self._feeding = False
        self._after_drain = False
        self._write_timer: asyncio.TimerHandle | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._deadline = 0.0
        self._on_expiry: Callable[[], None] | None = None
        # the request being received
        self._phase = _HEAD
        self._tail = b""
        self._left = 0
        self._in_message = False
        self._head_raw = 0
        self._head_bytes = 0
        self._head_too_large = False
        self._headers_done = False
        self._url = b""
        self._headers: dict[str, str] = {}
        self._repeated = ""
        self._body: list[bytes] = []
        self._size = 0
        self._too_large = False
        self._accounted = 0
        """Bytes of this connection counted in `limits.buffered_bytes` (held + the current body)."""
        self._ready: Request | None = None
        self._responder: Responder | None = None
        """The response in progress."""
        self._ready_keep_alive = True
        self._ready_head_only = False

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
        if not self.busy and not self._in_message and not self.held:
            self._close()

    def _read_expired(self) -> None:
        if self._in_message and not self.busy:
            self._reject(408, _NOT_IN_TIME)

    def _write_expired(self) -> None:
        """The client read nothing of what it was sent for client_write_timeout_s: drop it."""
        self._write_timer = None
        if self.closed or not self._paused:
            return
        self.timed_out = True
        self.limits.refuse("client_timeout")
        if self.transport is not None:
            self.transport.abort()  # what it did not read is dropped; connection_lost follows

    # asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = own = transport  # type: ignore[assignment]  # uvloop's is not an asyncio.Transport subclass
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else ""
        if not self.limits.admit_connection():
            self._reject(503, _BUSY_CONNECTIONS)
            return
        self.counted = True
        own.set_write_buffer_limits(high=self.limits.write_buffer_bytes)  # type: ignore[attr-defined]
        self._arm(IDLE_TIMEOUT_S, self._idle_expired)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.counted:
            self.counted = False
            self.limits.connections -= 1
        self._account(-self._accounted)
        for timer in (self._timer, self._write_timer):
            if timer is not None:
                timer.cancel()
        self._timer = self._write_timer = None
        self._wake()
        task, self.task = self.task, None
        if task is not None and not task.done():
            task.cancel()  # the client went away: stop the work it asked for
        hook, self.on_disconnect = self.on_disconnect, None
        if hook is not None and self.busy:
            hook()
        # nothing of this connection is kept alive by a cycle (parser <-> protocol, callbacks)
        self.parser = None
        self.resume_callbacks = []
        self.held = b""
        self._body = []
        self._ready = self._responder = None

    def eof_received(self) -> bool:
        """The client closed its side: answer what it asked (half-close), then close. Whether it
        only half-closed or is gone, a FIN does not say; so a response not started yet is preceded
        by interim `100 Continue` lines (RFC 9110 15.2: a client parses 1xx it did not ask for),
        and a second one PROBE_S later: a client that is gone answers the first with a reset, the
        second write fails, and its request is cancelled like any whose client left."""
        self._eof = True
        keep = self.busy or bool(self.held) or self._ready is not None
        if self.busy and self._responder is not None and self._responder.chunked:
            self._probe()
            self.loop.call_later(PROBE_S, self._probe)
        return keep

    def _probe(self) -> None:
        responder = self._responder
        if self.busy and not self.closed and responder is not None and not responder.started:
            self.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def pause_writing(self) -> None:
        self._paused = True
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.limits.client_write_timeout_s, self._write_expired)

    def resume_writing(self) -> None:
        self._paused = False
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        self._wake()
        callbacks, self.resume_callbacks = self.resume_callbacks, []
        for callback in callbacks:
            callback()
        if self._after_drain and not self.busy:
            self._after_drain = False
            self.loop.call_soon(self._go_on)

    @property
    def paused(self) -> bool:
        return self._paused

    def data_received(self, data: bytes) -> None:
        if self.busy or self.held or self._after_drain:
            self._hold(data, 0)
        else:
            self._feed(data, 0)

    # feeding the parser one request at a time
    def _hold(self, data: bytes, pos: int) -> None:
        if self.held:
            self.held, self.held_pos = self.held[self.held_pos:] + data[pos:], 0
        else:
            self.held, self.held_pos = data, pos
        self._account(len(data) - pos)
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def _account(self, delta: int) -> None:
        self._accounted += delta
        self.limits.buffered_bytes += delta

    def _feed(self, data: bytes, pos: int) -> None:
        self._feeding = True
        size = len(data)
        try:
            while pos < size and not self.closed:
                if self.busy or self._after_drain:
                    self._hold(data, pos)
                    return
                n = self._left if self._phase == _LENGTH and self._left > 0 else _cut(self._tail, data, pos)
                end = min(size, pos + n)
                piece = data if pos == 0 and end == size else data[pos:end]  # (copies one request at most)
                pos = end
                phase = self._phase
                if phase == _LENGTH:
                    self._left -= len(piece)
                else:
                    self._tail = piece[-3:] if len(piece) >= 3 else (self._tail + piece)[-3:]
                if not self._parse(piece):
                    return
                if phase == _HEAD and self._in_message and not self._headers_done:
                    self._head_raw += len(piece)  # the parser holds an incomplete head: bound it
                    if self._head_raw > MAX_HEAD_BYTES:
                        self._reject(431, _HEAD_TOO_LARGE)
                        return
                ready = self._ready
                if ready is not None:
                    self._ready = None
                    self._dispatch(ready)
        finally:
            self._feeding = False

    def _parse(self, piece: bytes) -> bool:
        try:
            self.parser.feed_data(piece)
        except httptools.HttpParserUpgrade:
            self._ready = None
            self._reject(400, _UPGRADE)
            return False
        except httptools.HttpParserError:
            self._ready = None
            self._reject(400, _MALFORMED)
            return False
        return not self.closed

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._in_message, self._headers_done = True, False
        self._url, self._headers, self._repeated = b"", {}, ""
        self._body, self._size, self._too_large = [], 0, False
        self._head_bytes, self._head_raw, self._head_too_large = 0, 0, False
        self._arm(self.read_timeout_s, self._read_expired)

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_bytes += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._headers_done:
            return  # a trailer of a chunked body: read, never merged into the headers
        self._head_bytes += len(name) + len(value)
        headers = self._headers
        if len(headers) >= MAX_HEADER_COUNT or self._head_bytes > MAX_HEAD_BYTES:
            self._head_too_large = True
            return
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        if key in headers:
            if key in SINGLE:
                self._repeated = key
            else:
                headers[key] = headers[key] + ", " + text
        else:
            headers[key] = text

    def on_headers_complete(self) -> None:
        self._headers_done = True
        self._head_raw = 0
        self._tail = b""
        parser = self.parser
        if self._head_too_large or parser.should_upgrade():
            return  # answered at the end of the message (431) or by the upgrade exception (400)
        headers = self._headers
        version = parser.get_http_version()
        if self._repeated:
            self._reject(400, _error(400, f"the {self._repeated} header is repeated"))
            return
        if version == "1.1" and "host" not in headers:
            self._reject(400, _NO_HOST)
            return
        coding = headers.get("transfer-encoding")
        length = 0
        if coding is not None:
            if coding.strip().lower() != "chunked":
                self._reject(501, _TRANSFER_CODING)
                return
            self._phase = _CHUNKED
        else:
            declared = headers.get("content-length")
            length = int(declared) if declared is not None and declared.strip().isdigit() else 0
            if length:
                self._phase, self._left = _LENGTH, length
        expect = headers.get("expect")
        if length > self.max_body_bytes and expect is not None:
            self._reject(413, _TOO_LARGE)  # the client waits for a go-ahead: no need to read the body
            return
        if length:  # a declared body is reserved whole: the cap holds before the bytes arrive
            reserve = min(length, self.max_body_bytes)
            if not self.limits.fits(reserve):
                self.limits.refuse("buffered_bytes")
                self._reject(503, _BUSY_BYTES)
                return
            self._account(reserve)
        if expect is not None and version == "1.1" and expect.lower() == "100-continue":
            self.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl waits a second for this before a large body

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size > self.max_body_bytes:
            self._too_large = True  # read on and drop, then 413
            return
        if self._phase == _CHUNKED:  # (a body of declared length was reserved with its head)
            if not self.limits.fits(len(body)):
                self.limits.refuse("buffered_bytes")
                self._reject(503, _BUSY_BYTES)
                return
            self._account(len(body))
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._in_message, self._phase, self._tail, self._left = False, _HEAD, b"", 0
        parser = self.parser
        if self.closed or parser.should_upgrade():
            return
        self._disarm()
        if self._too_large or self._head_too_large:
            self._reject(413 if self._too_large else 431, _TOO_LARGE if self._too_large else _HEAD_TOO_LARGE)
            return
        url = self._url.decode("latin-1")
        if url.startswith("/") and "?" not in url and "#" not in url:
            path, query = url, {}  # the common case: a plain origin-form path
        else:
            parts = urlsplit(url)
            path, query = parts.path, parse_qs(parts.query)
        method = parser.get_method().decode()
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._body = []
        self._ready = Request(method="GET" if method == "HEAD" else method, path=path, query=query,
                              headers=self._headers, body=body, peer=self.peer,
                              http_version=parser.get_http_version())
        self._ready_keep_alive, self._ready_head_only = parser.should_keep_alive(), method == "HEAD"

    # answering
    def _reject(self, status: int, body: bytes) -> None:
        """Answer and close (only ever when no other response is in progress)."""
        self._disarm()
        if self.transport is not None and not self.closed:
            headers = [("content-type", "application/json"), ("content-length", str(len(body))),
                       ("connection", "close")]
            if status == 503:
                headers.append(("retry-after", "1"))
            self.transport.write(status_line(status) + header_block(headers) + b"\r\n" + body)
        self._close()

    def _close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True

    def _dispatch(self, request: Request) -> None:
        self.busy = True
        responder = self._responder = Responder(self, self._ready_keep_alive and not self._eof,
                                                self._ready_head_only, chunked=request.http_version != "1.0")
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
            responder.send(500, _INTERNAL)
        elif not responder.finished:
            self._close()

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

    # Connection (what a Responder uses)
    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    async def drain(self) -> None:
        if self._paused and not self.closed:
            self._drain = self.loop.create_future()
            await self._drain

    def _wake(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def when_resumed(self, callback: Callable[[], None]) -> None:
        self.resume_callbacks.append(callback)

    def when_gone(self, callback: Callable[[], None]) -> None:
        self.on_disconnect = callback

    def response_done(self, keep_alive: bool) -> None:
        self.busy = False
        self.on_disconnect = None
        self._responder = None
        self._account(-(self._accounted - (len(self.held) - self.held_pos)))  # the request's body is the handler's no more
        if self.closed:
            return
        if not keep_alive or (self._eof and not self.held):
            self._close()
            return
        if self._paused:
            self._after_drain = True  # the next request waits until this response has drained
            return
        if self._feeding:
            return  # answered while its request was being fed: the feeding loop goes on
        if self.held or self._reading_paused:
            self.loop.call_soon(self._go_on)  # after the current handler has returned
        else:
            self._arm(IDLE_TIMEOUT_S, self._idle_expired)

    def _go_on(self) -> None:
        """The previous response is out: parse what the client sent meanwhile, then read again."""
        if self.closed or self.busy:
            return
        data, pos, self.held, self.held_pos = self.held, self.held_pos, b"", 0
        self._account(pos - len(data))
        if data:
            self._feed(data, pos)
        if self.closed or self.busy or self.held:
            return
        if self._eof and not self._in_message:
            self._close()
            return
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()
        if not self._in_message:
            self._arm(IDLE_TIMEOUT_S, self._idle_expired)


async def serve(handler: Handler, host: str, port: int, reuse_port: bool = False,
                on_error: Callable[[BaseException], None] | None = None, read_timeout_s: float | None = None,
                max_body_bytes: int | None = None, limits: ServerLimits | None = None) -> asyncio.Server:
    """`read_timeout_s`: a request's head and body must arrive within it (else 408; default
    READ_TIMEOUT_S); `max_body_bytes`: larger bodies are read, dropped and answered 413 (default
    MAX_BODY_BYTES); `limits`: the listener's caps (defaults: `ServerLimits()`)."""
    loop = asyncio.get_running_loop()
    shared = limits if limits is not None else ServerLimits()
    # asyncio and uvloop set TCP_NODELAY on accepted TCP sockets: no Nagle stall on SSE chunks.
    return await loop.create_server(lambda: HttpProtocol(handler, shared, on_error, read_timeout_s, max_body_bytes),
                                    host, port, reuse_port=reuse_port, backlog=1024)


async def serve_unix(handler: Handler, path: str, on_error: Callable[[BaseException], None] | None = None,
                     max_body_bytes: int | None = None) -> asyncio.Server:
    """The same HTTP/1.1 server on a Unix socket (a process's private channel to its siblings:
    only processes that can open `path` reach it)."""
    loop = asyncio.get_running_loop()
    shared = ServerLimits()
    return await loop.create_unix_server(lambda: HttpProtocol(handler, shared, on_error, None, max_body_bytes), path,
                                         backlog=64)
