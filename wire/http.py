"""A lean HTTP/1.1 server on asyncio + httptools: keep-alive, request bodies, full responses and
chunked streaming with flow control, client-disconnect notice. The simulated engine and the
router both serve through it (one data plane, no framework on the hot path).

    async def handler(request: Request, response: Responder) -> None: ...
    server = await serve(handler, "127.0.0.1", 8000)

Connection semantics, as nginx and Envoy have them:
- One request at a time (`wire.reader` feeds the parser up to the end of the request in
  hand): what a pipelining client sent after it waits, unparsed, with reading paused, until the
  response has been handed to the socket and the socket has drained below its high-water mark.
  So pipelined requests wait in the client's socket, at most one read of them in memory, and an
  interim `100 Continue` can only belong to the request being served.
- Caps per listener and per client address (`wire.limits.ServerLimits`): open connections
  and buffered request bytes, counted as they arrive (503 + Retry-After past either; at the
  connection cap the longest idle connection is closed to make room first); an idle keep-alive
  connection is closed after `idle_timeout_s`, a request head not complete within
  `head_timeout_s`, or a request whose head and body have not all come within `read_timeout_s`,
  is answered 408 (a slow head or body cannot hold a slot for longer); at the connection cap with
  no idle connection, the one whose head has been arriving the longest is closed (408) once
  it is older than `stalled_head_s` (slowloris from many addresses cannot hold the cap; a new
  connection waits for its first head, so a silent one is evictable too, silently); a
  client that leaves its response unread for `client_write_timeout_s` is disconnected
  (`Responder.timed_out` says so to the handler). Every refusal is counted by cause.
- What a request head must be, and what is refused: `wire.reader`. The server's owner may
  look at each complete head before any of its body is buffered (`head_check`) and answer it
  instead of the handler, its body read and dropped (the router: 401 for a body sent without a
  valid key, so no one without a key can fill the buffered-bytes cap).
- A refused request is answered and the connection closed after a lingering read (as nginx's
  lingering close), so what the client still sends does not reset the answer away.
- A client that half-closes after its request still gets the answer; the connection closes
  after it.
"""

from __future__ import annotations

__all__ = ["Handler", "HttpProtocol", "serve"]

import asyncio
import time
from collections.abc import Awaitable, Callable

from wire.deadline import Deadline
from wire.limits import ServerLimits, client_key
from wire.reader import (
    HeadCheck,
    Request,
    RequestReader,
    error_body,
)
from wire.responder import Responder, header_block, status_line

MAX_BODY_BYTES = 8 * 1024 * 1024
READ_TIMEOUT_S = 30.0
"""A request whose headers and body have not all arrived after this long is answered 408."""
LINGER_S = 2.0
"""How long a closing connection reads and drops what its client still sends (see _close)."""
PROBE_S = 0.2
"""After a client's FIN with its answer pending: when the second probe goes (see eof_received)."""
_NOT_IN_TIME = error_body(408, "request not received in time")
_HEAD_NOT_IN_TIME = error_body(408, "request head not received in time")
_BUSY_CONNECTIONS = error_body(503, "too many open connections: retry later")
_INTERNAL = b'{"error": {"message": "internal error", "type": "server_error", "code": 500}}'


Handler = Callable[[Request, Responder], Awaitable[None] | None]
"""Either a coroutine function, or a plain function that answers through `Responder` — now or
later from callbacks — and returns None (or a coroutine for the part that has to wait)."""


class HttpProtocol(asyncio.Protocol):
    def __init__(self, handler: Handler, limits: ServerLimits, on_error: Callable[[BaseException], None] | None = None,
                 read_timeout_s: float | None = None, max_body_bytes: int | None = None,
                 head_check: HeadCheck | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        self.handler = handler
        self.limits = limits
        self.on_error = on_error
        self.read_timeout_s = READ_TIMEOUT_S if read_timeout_s is None else read_timeout_s
        self.max_body_bytes = MAX_BODY_BYTES if max_body_bytes is None else max_body_bytes
        self.loop = asyncio.get_running_loop()  # (asking for it each time costs a getpid() before 3.12)
        self.transport: asyncio.Transport | None = None
        self.reader = RequestReader(self, limits, self.max_body_bytes, "", head_check, clock)
        self.closed = False
        self.counted = False
        """This connection counts toward the listener's connection caps."""
        self.idle = False
        """Between requests with nothing held: evictable at the connection cap (`limits.idle`)."""
        self.in_head = False
        """A request head is arriving: evictable at the cap once stalled (`limits.heads`)."""
        self._began = 0.0
        """When the request at hand began to arrive (loop time)."""
        self.peer = ""
        self.client = ""
        """The client address the per-client caps count this connection under."""
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
        self._lingering = False
        self._after_drain = False
        self._write_timer: asyncio.TimerHandle | None = None
        self._linger_timer: asyncio.TimerHandle | None = None
        self.deadline = Deadline(self.loop)
        """Idle between requests, or reading one."""
        self._accounted = 0
        """Bytes of this connection counted in `limits.buffered_bytes` (held + the current body)."""
        self._responder: Responder | None = None
        """The response in progress."""

    def _idle_expired(self) -> None:
        if not self.busy and not self.reader.in_message and not self.held:
            self._close()

    def _read_expired(self) -> None:
        if self.reader.in_message and not self.busy and not self.closed:
            in_head = self.reader.in_head
            self.limits.refuse("head_timeout" if in_head else "read_timeout")
            self.reject(408, _HEAD_NOT_IN_TIME if in_head else _NOT_IN_TIME)

    def _await_request(self) -> None:
        """Between requests: the idle deadline runs and the connection may be evicted at the cap."""
        self.deadline.arm(self.limits.idle_timeout_s, self._idle_expired)
        if self.counted and not self.idle:
            self.idle = True
            self.limits.idle[self] = None

    def _busy_now(self) -> None:
        if self.idle:
            self.idle = False
            self.limits.idle.pop(self, None)

    def _head_over(self) -> None:
        if self.in_head:
            self.in_head = False
            self.limits.head_over(self)

    def _uncount(self) -> None:
        self._busy_now()
        self._head_over()
        if self.counted:
            self.counted = False
            self.limits.release_connection(self.client)

    def evict(self) -> None:
        """Closed to make room at the connection cap (idle, or its head stalled): its count goes now."""
        self.idle = self.in_head = False  # (the limits took it off their lists)
        self.deadline.disarm()
        self._uncount()
        if self.reader.in_head:
            self.write(self._answer(408, _HEAD_NOT_IN_TIME))  # (no lingering: the room is needed now)
        self._close()

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
        if isinstance(peer, tuple):
            self.peer = self.reader.peer = f"{peer[0]}:{peer[1]}"
            self.client = client_key(str(peer[0]))
        if not self.limits.admit_connection(self.client):
            self.reject(503, _BUSY_CONNECTIONS)
            return
        self.counted = True
        own.set_write_buffer_limits(high=self.limits.write_buffer_bytes)  # type: ignore[attr-defined]
        # Waiting for its first request: its head phase has begun (evictable at the cap once
        # stalled, not as idle: a client that has just connected is about to send its head).
        self.deadline.arm(self.limits.idle_timeout_s, self._idle_expired)
        self.in_head = True
        self.limits.head_begun(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._uncount()
        self.account(-self._accounted)
        self.deadline.cancel()
        for timer in (self._write_timer, self._linger_timer):
            if timer is not None:
                timer.cancel()
        self._write_timer = self._linger_timer = None
        self._wake()
        task, self.task = self.task, None
        if task is not None and not task.done() and self.busy:
            task.cancel()  # the client went away: stop the work it asked for (not what follows its answer)
        hook, self.on_disconnect = self.on_disconnect, None
        if hook is not None and self.busy:
            hook()
        # nothing of this connection is kept alive by a cycle (parser <-> protocol, callbacks)
        self.reader.close()
        self.resume_callbacks = []
        self.held = b""
        self._responder = None

    def eof_received(self) -> bool:
        """The client closed its side: answer what it asked (half-close), then close. Whether it
        only half-closed or is gone, a FIN does not say; so a response not started yet is preceded
        by interim `100 Continue` lines (RFC 9110 15.2: a client parses 1xx it did not ask for),
        and a second one PROBE_S later: a client that is gone answers the first with a reset, the
        second write fails, and its request is cancelled like any whose client left."""
        self._eof = True
        if self._lingering:
            return False
        keep = self.busy or bool(self.held) or self.reader.ready is not None
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
        if self.closed:
            return  # lingering: read and dropped
        if self.idle:
            self._busy_now()
        if self.busy or self.held or self._after_drain:
            self._hold(data, 0)
        else:
            self._feed(data, 0)

    # feeding the parser one request at a time
    def _hold(self, data: bytes, pos: int) -> None:
        if not self.take(len(data) - pos):  # sent ahead past its caps while its answers wait: dropped
            if self.transport is not None:
                self.transport.abort()
            self.closed = True
            return
        if self.held:
            self.held, self.held_pos = self.held[self.held_pos:] + data[pos:], 0
        else:
            self.held, self.held_pos = data, pos
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def _feed(self, data: bytes, pos: int) -> None:
        """One request at a time: parse up to the end of the next one, hand it over, and hold
        the rest while its response is under way."""
        self._feeding = True
        size = len(data)
        reader = self.reader
        try:
            while pos < size and not self.closed:
                if self.busy or self._after_drain:
                    self._hold(data, pos)
                    return
                pos = reader.feed(data, pos)
                ready = reader.ready
                if ready is not None and not self.closed:
                    reader.ready = None
                    self._dispatch(ready)
        finally:
            self._feeding = False

    # Sink (what the reader uses), with reject below
    def account(self, delta: int) -> None:
        if delta:
            self._accounted += delta
            self.limits.add_bytes(self.client, delta)

    def take(self, more_bytes: int) -> bool:
        if self.limits.take(self.client, more_bytes):
            return False  # refused (counted by cause)
        self._accounted += more_bytes
        return True

    def message_begun(self) -> None:
        self._began = self.loop.time()
        self.deadline.arm(min(self.limits.head_timeout_s, self.read_timeout_s), self._read_expired)
        if self.counted and not self.closed and not self.in_head:  # (a new connection's began when it came)
            self.in_head = True
            self.limits.head_begun(self)

    def head_done(self) -> None:
        self._head_over()
        if self.read_timeout_s > self.limits.head_timeout_s:  # the body's time counts from the first byte
            self.deadline.arm(self._began + self.read_timeout_s - self.loop.time(), self._read_expired)

    # answering
    def reject(self, status: int, body: bytes) -> None:
        """Answer and close (only ever when no other response is in progress)."""
        self.deadline.disarm()
        self._head_over()
        if self.transport is not None and not self.closed:
            self.transport.write(self._answer(status, body))
        self._close(linger=status != 503 or self.counted)

    @staticmethod
    def _answer(status: int, body: bytes) -> bytes:
        headers = [("content-type", "application/json"), ("content-length", str(len(body))), ("connection", "close")]
        if status == 503:
            headers.append(("retry-after", "1"))
        return status_line(status) + header_block(headers) + b"\r\n" + body

    def _close(self, linger: bool = False) -> None:
        """Close; `linger`: the client may still be sending (a refused request's body, pipelined
        requests), so, as nginx's lingering close, end our side and read and drop what comes for up
        to LINGER_S before closing: a close with unread bytes would reset the connection, and a
        reset can destroy the answer before the client has read it."""
        self._head_over()
        transport = self.transport
        if transport is not None and not self.closed:
            if linger and transport.can_write_eof():
                self._lingering = True
                transport.write_eof()
                if self._reading_paused:
                    self._reading_paused = False
                    transport.resume_reading()
                self._linger_timer = self.loop.call_later(LINGER_S, transport.close)
            else:
                transport.close()
        self.closed = True

    def _dispatch(self, request: Request) -> None:
        self.deadline.disarm()  # it has all arrived: no read deadline while it is answered
        self.busy = True
        responder = self._responder = Responder(self, self.reader.keep_alive and not self._eof,
                                                self.reader.head_only, chunked=request.http_version != "1.0")
        self.task = None
        refusal = self.reader.refusal
        if refusal is not None:  # refused by its head (its body was dropped): the refusal is its answer
            self.reader.refusal = None
            responder.send(refusal[0], refusal[1])
            return
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
        # the request's body is the handler's no more: only held bytes stay counted
        self.account(-(self._accounted - (len(self.held) - self.held_pos)))
        if self.closed:
            return
        if not keep_alive or (self._eof and not self.held):
            self._close(linger=bool(self.held))
            return
        if self._paused:
            self._after_drain = True  # the next request waits until this response has drained
            return
        if self._feeding:
            return  # answered while its request was being fed: the feeding loop goes on
        if self.held or self._reading_paused:
            self.loop.call_soon(self._go_on)  # after the current handler has returned
        else:
            self._await_request()

    def _go_on(self) -> None:
        """The previous response is out: parse what the client sent meanwhile, then read again."""
        if self.closed or self.busy:
            return
        data, pos, self.held, self.held_pos = self.held, self.held_pos, b"", 0
        self.account(pos - len(data))
        if data:
            self._feed(data, pos)
        if self.closed or self.busy or self.held:
            return
        if self._eof and not self.reader.in_message:
            self._close()
            return
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()
        if not self.reader.in_message:
            self._await_request()


async def serve(handler: Handler, host: str, port: int, reuse_port: bool = False,
                on_error: Callable[[BaseException], None] | None = None, read_timeout_s: float | None = None,
                max_body_bytes: int | None = None, limits: ServerLimits | None = None,
                head_check: HeadCheck | None = None, clock: Callable[[], float] = time.perf_counter
                ) -> asyncio.Server:
    """`read_timeout_s`: a request's head and body must arrive within it (else 408; default
    READ_TIMEOUT_S); `max_body_bytes`: larger bodies are read, dropped and answered 413 (default
    MAX_BODY_BYTES); `limits`: the listener's caps (defaults: `ServerLimits()`); `head_check`:
    looks at each complete head before its body is buffered, and may answer it instead of the
    handler, its body dropped (None: every head goes on); `clock`: stamps each request's first
    byte (`Request.arrived`), the clock the handler measures latencies on."""
    loop = asyncio.get_running_loop()
    shared = limits if limits is not None else ServerLimits()
    # asyncio and uvloop set TCP_NODELAY on accepted TCP sockets: no Nagle stall on SSE chunks.
    return await loop.create_server(
        lambda: HttpProtocol(handler, shared, on_error, read_timeout_s, max_body_bytes, head_check, clock),
        host, port, reuse_port=reuse_port, backlog=1024)


async def serve_unix(handler: Handler, path: str, on_error: Callable[[BaseException], None] | None = None,
                     max_body_bytes: int | None = None) -> asyncio.Server:
    """The same HTTP/1.1 server on a Unix socket (a process's private channel to its siblings:
    only processes that can open `path` reach it)."""
    loop = asyncio.get_running_loop()
    shared = ServerLimits()
    return await loop.create_unix_server(lambda: HttpProtocol(handler, shared, on_error, None, max_body_bytes), path,
                                         backlog=64)
