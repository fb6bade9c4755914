"""One HTTP/1.1 response on a `wire.http` connection: sent whole, or streamed in chunks with
flow control (a callback source pauses while the client is slow and resumes when it drains).
To an HTTP/1.0 client a stream goes unframed and the connection closes after it (1.0 has no
chunked encoding). The responder reaches its connection only through `Connection`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Protocol

_STATUS_LINES: dict[int, bytes] = {}


def status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = "Status"
        line = _STATUS_LINES[status] = f"HTTP/1.1 {status} {phrase}\r\n".encode()
    return line


def header_block(headers: Iterable[tuple[str, str]] | bytes) -> bytes:
    if isinstance(headers, bytes):  # already a header block ("name: value\r\n"...)
        return headers
    return b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in headers)


class Connection(Protocol):
    """What a response needs of its connection."""

    @property
    def closed(self) -> bool: ...

    @property
    def paused(self) -> bool:
        """The client is not keeping up (the write buffer is over its high-water mark)."""

    @property
    def timed_out(self) -> bool:
        """The connection was closed because the client read nothing for too long."""

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...

    def response_done(self, keep_alive: bool) -> None: ...

    def when_resumed(self, callback: Callable[[], None]) -> None: ...

    def when_gone(self, callback: Callable[[], None]) -> None: ...


class Responder:
    """One response. Either `send()` once, or `start_stream()` then `write()`s then `end()`."""

    __slots__ = ("_c", "_head_only", "_keep_alive", "chunked", "finished", "started")

    def __init__(self, connection: Connection, keep_alive: bool, head_only: bool = False,
                 chunked: bool = True) -> None:
        self._c = connection
        self._keep_alive = keep_alive
        self._head_only = head_only
        self.chunked = chunked
        """False for an HTTP/1.0 client: a stream is sent as it is and ends with the connection."""
        self.started = False
        self.finished = False

    @property
    def disconnected(self) -> bool:
        return self._c.closed

    @property
    def timed_out(self) -> bool:
        """The client was disconnected for not reading (its request's outcome is `client_timeout`)."""
        return self._c.timed_out

    def send(self, status: int, body: bytes, content_type: str = "application/json",
             headers: Iterable[tuple[str, str]] | bytes = ()) -> None:
        if self.started:
            raise RuntimeError("response already started")
        self.started = self.finished = True
        head = b"%bcontent-type: %b\r\ncontent-length: %d\r\nconnection: %b\r\n%b\r\n" % (
            status_line(status), content_type.encode("latin-1"), len(body),
            b"keep-alive" if self._keep_alive else b"close", header_block(headers))
        self._c.write(head if self._head_only else head + body)
        self._c.response_done(self._keep_alive)

    def start_stream(self, status: int = 200, content_type: str = "text/event-stream",
                     headers: Iterable[tuple[str, str]] | bytes = ()) -> None:
        self._c.write(self.stream_head(status, content_type, headers))

    def stream_head(self, status: int = 200, content_type: str = "text/event-stream",
                    headers: Iterable[tuple[str, str]] | bytes = ()) -> bytes:
        """Start a streamed response and return its head for the caller to write (with the first
        chunks, in one write: `write_framed`)."""
        if self.started:
            raise RuntimeError("response already started")
        self.started = True
        if not self.chunked:
            self._keep_alive = False  # the body ends where the connection does
            return b"%bcontent-type: %b\r\ncache-control: no-cache\r\nconnection: close\r\n%b\r\n" % (
                status_line(status), content_type.encode("latin-1"), header_block(headers))
        return (b"%bcontent-type: %b\r\ntransfer-encoding: chunked\r\ncache-control: no-cache\r\n"
                b"connection: %b\r\n%b\r\n") % (
            status_line(status), content_type.encode("latin-1"), b"keep-alive" if self._keep_alive else b"close",
            header_block(headers))

    def frame(self, chunk: bytes) -> bytes:
        """One piece of a streamed body, framed as this response sends it."""
        if not self.chunked:
            return chunk
        return b"%x\r\n%b\r\n" % (len(chunk), chunk)

    async def write(self, chunk: bytes) -> None:
        if not chunk or self._c.closed:
            return
        self._c.write(self.frame(chunk))
        await self._c.drain()

    def write_nowait(self, chunk: bytes) -> bool:
        """Write a chunk from a callback; True when the client is not keeping up (pause the
        source and resume it from `on_resume`)."""
        if chunk and not self._c.closed:
            self._c.write(self.frame(chunk))
        return self._c.paused

    def write_framed(self, data: bytes) -> bool:
        """Write bytes already framed (a head from `stream_head`, pieces from `frame`) as they
        are; True when the client is not keeping up."""
        if data and not self._c.closed:
            self._c.write(data)
        return self._c.paused

    def on_resume(self, callback: Callable[[], None]) -> None:
        self._c.when_resumed(callback)

    def on_disconnect(self, callback: Callable[[], None]) -> None:
        """Called once if the client goes away before this response is finished (a handler that
        returned without awaiting uses it to stop the upstream work; a task is cancelled instead)."""
        self._c.when_gone(callback)

    def end(self, framed: bytes = b"") -> None:
        """The end of a stream; `framed`: what is still to go before it (written with it, in one write)."""
        if self.finished:
            return
        self.finished = True
        if not self._c.closed:
            tail = b"0\r\n\r\n" if self.chunked else b""
            data = framed + tail if framed else tail
            if data:
                self._c.write(data)
        self._c.response_done(self._keep_alive)
