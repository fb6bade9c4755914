"""One HTTP/1.1 response on a `pools.wire.http` connection: sent whole, or streamed in chunks with
flow control (a callback source pauses while the client is slow and resumes when it drains)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pools.wire.http import HttpProtocol

_STATUS_LINES: dict[int, bytes] = {}


def _status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = "Status"
        line = _STATUS_LINES[status] = f"HTTP/1.1 {status} {phrase}\r\n".encode()
    return line


def _header_block(headers: Iterable[tuple[str, str]] | bytes) -> bytes:
    if isinstance(headers, bytes):  # already a header block ("name: value\r\n"...)
        return headers
    return b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in headers)


class Responder:
    """One response. Either `send()` once, or `start_stream()` then `write()`s then `end()`."""

    def __init__(self, protocol: HttpProtocol, keep_alive: bool, head_only: bool = False) -> None:
        self._p = protocol
        self._keep_alive = keep_alive
        self._head_only = head_only
        self.started = False
        self.finished = False

    @property
    def disconnected(self) -> bool:
        return self._p.closed

    def send(self, status: int, body: bytes, content_type: str = "application/json",
             headers: Iterable[tuple[str, str]] | bytes = ()) -> None:
        if self.started:
            raise RuntimeError("response already started")
        self.started = self.finished = True
        head = b"%bcontent-type: %b\r\ncontent-length: %d\r\nconnection: %b\r\n%b\r\n" % (
            _status_line(status), content_type.encode("latin-1"), len(body),
            b"keep-alive" if self._keep_alive else b"close", _header_block(headers))
        self._p.write(head if self._head_only else head + body)
        self._p.response_done(self._keep_alive)

    def start_stream(self, status: int = 200, content_type: str = "text/event-stream",
                     headers: Iterable[tuple[str, str]] | bytes = ()) -> None:
        self._p.write(self.stream_head(status, content_type, headers))

    def stream_head(self, status: int = 200, content_type: str = "text/event-stream",
                    headers: Iterable[tuple[str, str]] | bytes = ()) -> bytes:
        """Start a chunked response and return its head for the caller to write (with the first
        chunks, in one write: `write_framed`)."""
        if self.started:
            raise RuntimeError("response already started")
        self.started = True
        return (b"%bcontent-type: %b\r\ntransfer-encoding: chunked\r\ncache-control: no-cache\r\n"
                b"connection: %b\r\n%b\r\n") % (
            _status_line(status), content_type.encode("latin-1"), b"keep-alive" if self._keep_alive else b"close",
            _header_block(headers))

    @staticmethod
    def frame(chunk: bytes) -> bytes:
        """One chunk of a chunked body, framed."""
        return b"%x\r\n%b\r\n" % (len(chunk), chunk)

    async def write(self, chunk: bytes) -> None:
        if not chunk or self._p.closed:
            return
        self._p.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
        await self._p.drain()

    def write_nowait(self, chunk: bytes) -> bool:
        """Write a chunk from a callback; True when the client is not keeping up (pause the
        source and resume it from `on_resume`)."""
        if chunk and not self._p.closed:
            self._p.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
        return self._p.paused

    def write_framed(self, data: bytes) -> bool:
        """Write bytes already framed (a head from `stream_head`, chunks from `frame`) as they
        are; True when the client is not keeping up."""
        if data and not self._p.closed:
            self._p.write(data)
        return self._p.paused

    def on_resume(self, callback: Callable[[], None]) -> None:
        self._p.resume_callbacks.append(callback)

    def on_disconnect(self, callback: Callable[[], None]) -> None:
        """Called once if the client goes away before this response is finished (a handler that
        returned without awaiting uses it to stop the upstream work; a task is cancelled instead)."""
        self._p.on_disconnect = callback

    def end(self, framed: bytes = b"") -> None:
        """The last chunk; `framed`: what is still to go before it (written with it, in one write)."""
        if self.finished:
            return
        self.finished = True
        if not self._p.closed:
            self._p.write(framed + b"0\r\n\r\n" if framed else b"0\r\n\r\n")
        self._p.response_done(self._keep_alive)
