"""The receiving half of a `wire.http` connection: httptools fed one request at a time, and
the rules a request head must follow.

The parser is fed only up to the end of the request in hand — the first CRLF CRLF of a head or
of a chunked body (a request without a body, and a chunked body, can only end there), or the
declared length of a body — so whatever a pipelining client sent after it stays unparsed bytes
that the connection holds until the response is out. Refused (through `Sink.reject`): a head
over MAX_HEAD_BYTES or MAX_HEADER_COUNT (431, as soon as the limit is passed: header lines are
counted, a repeated one included, so 16,000 copies of one header cost no more than 101), a body
over the limit (413), HTTP/1.1 without Host, a repeated header of SINGLE (400), a
Transfer-Encoding other than `chunked` alone (501), protocol upgrades (400), malformed HTTP
(400), bytes past the listener's buffered-bytes caps (503). The server's owner may refuse a
request by its head (`HeadCheck`: a router refuses a body sent without a valid key): its body is
then read and dropped, never buffered (as nginx discards a body it will not use), and the
refusal is its answer, once the body has come, on a connection kept alive. Trailers of a
chunked body are read and dropped: they never add to or replace a header (and count toward
MAX_HEADER_COUNT).

A body is counted against the caps as its bytes arrive (a declared Content-Length reserves
nothing: a head that declares 4 MiB and sends nothing holds nothing), and it is kept in one
buffer however it arrives: a body sent in 2-byte chunks costs what its bytes cost (about 1.1x
with the buffer's growth), not a Python object per chunk (~28x). Each refusal is counted in
`ServerLimits.refused` by cause.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

import httptools

from wire.limits import ServerLimits

MAX_HEADER_COUNT = 100
MAX_HEAD_BYTES = 64 * 1024
"""Request line plus headers; past either limit the request is answered 431."""
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
    arrived: float = 0.0
    """The server's clock (`serve(clock=...)`) when the request's first byte was parsed: a
    latency measured from it counts reading, checking and parsing the request too."""


HeadCheck = Callable[[Request], tuple[int, bytes] | None]
"""The server owner's look at a complete head (a `Request` with no body yet), before any body
byte is buffered: None lets it through; (status, JSON body) is the request's answer instead of
the handler's, its body read and dropped (counted as `head_refused`; a client waiting for
`100 Continue` is answered at once and the connection closed)."""


def error_body(status: int, message: str) -> bytes:
    """An error body in OpenAI's shape, for what the server refuses before any handler runs."""
    kind = b"BadRequestError" if status == 400 else b"invalid_request_error"  # as wire.errors.default_kind
    return (b'{"error": {"message": "%b", "type": "%b", "param": null, "code": %d}}'
            % (message.encode(), kind, status))


MALFORMED = error_body(400, "malformed HTTP request")
UPGRADE = error_body(400, "protocol upgrades are not supported")
NO_HOST = error_body(400, "an HTTP/1.1 request needs a Host header")
TOO_LARGE = error_body(413, "request body too large")
HEAD_TOO_LARGE = error_body(431, f"request headers too large (at most {MAX_HEADER_COUNT} headers, "
                                 f"{MAX_HEAD_BYTES} bytes)")
TRANSFER_CODING = error_body(501, "only the chunked transfer coding is supported for request bodies")
BUSY_BYTES = error_body(503, "too many request bytes in flight: retry later")
TINY_PIECES_AFTER = 1024
MIN_PIECE_BYTES = 64
"""A body that has come in more than TINY_PIECES_AFTER pieces averaging under MIN_PIECE_BYTES
is refused (400): each piece costs a parser callback, so 2-byte chunks would cost ~50x the CPU
of the same bytes in one piece. Real clients' pieces are chunks of kilobytes or TCP reads."""
TINY_PIECES = error_body(400, f"request body in too many tiny pieces (over {TINY_PIECES_AFTER}, averaging under "
                              f"{MIN_PIECE_BYTES} bytes)")


class Sink(Protocol):
    """What the reader needs of its connection."""

    @property
    def closed(self) -> bool: ...

    def reject(self, status: int, body: bytes) -> None:
        """Answer this and close."""

    def write(self, data: bytes) -> None: ...

    def account(self, delta: int) -> None:
        """Request bytes held in memory for this connection, more or fewer."""

    def take(self, more_bytes: int) -> bool:
        """Count `more_bytes` of body held for this connection if the caps allow; False (the
        refusal counted) if not."""

    def message_begun(self) -> None:
        """A request has started to arrive (its head and read deadlines start)."""

    def head_done(self) -> None:
        """The request's head is complete (its body, if any, follows)."""


class _Gone:
    """The sink of a reader whose connection is gone."""

    closed = True

    def reject(self, status: int, body: bytes) -> None:
        pass

    def write(self, data: bytes) -> None:
        pass

    def account(self, delta: int) -> None:
        pass

    def take(self, more_bytes: int) -> bool:
        return False

    def message_begun(self) -> None:
        pass

    def head_done(self) -> None:
        pass


_GONE = _Gone()


class _HeadTooLarge(Exception):
    """Raised from a parser callback to stop parsing a head past MAX_HEADER_COUNT / MAX_HEAD_BYTES
    (httptools wraps it in an HttpParserCallbackError)."""


def cut(tail: bytes, data: bytes, pos: int) -> int:
    """How many bytes of `data` from `pos` to feed: up to and including the first CRLF CRLF
    (which may start in `tail`, the last bytes fed), or all of them."""
    if tail:
        k = (tail + data[pos:pos + 3]).find(_END)
        if k >= 0:
            return k + 4 - len(tail)
    k = data.find(_END, pos)
    return len(data) - pos if k < 0 else k + 4 - pos


class RequestReader:
    def __init__(self, sink: Sink, limits: ServerLimits, max_body_bytes: int, peer: str,
                 head_check: HeadCheck | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        self.sink, self.limits, self.max_body_bytes, self.peer = sink, limits, max_body_bytes, peer
        self.head_check = head_check
        self.clock = clock
        self._arrived = 0.0
        self.parser: Any = httptools.HttpRequestParser(self)
        self.ready: Request | None = None
        """A request that has arrived whole, for the connection to take."""
        self.keep_alive = True
        self.head_only = False
        self.in_message = False
        self._phase = _HEAD
        self._head: Request | None = None
        """The request as its head made it, while its body arrives (with a head check only)."""
        self.refusal: tuple[int, bytes] | None = None
        """The head check's answer to the request at hand (its body is dropped as it comes)."""
        self._tail = b""
        self._left = 0
        self._head_raw = 0
        self._head_bytes = 0
        self._head_too_large = False
        self._headers_done = False
        self._url = b""
        self._headers: dict[str, str] = {}
        self._joined: dict[str, list[str]] = {}
        """Values of headers sent more than once, joined when the head is complete."""
        self._lines = 0
        """Header and trailer lines of the request at hand."""
        self._repeated = ""
        self._first = b""
        """The body while it is one piece (the common case: no copy)."""
        self._body = bytearray()
        """The body once a second piece has come: one buffer, however small the pieces."""
        self._size = 0
        self._pieces = 0
        self._too_large = False

    def close(self) -> None:
        """The connection is gone: drop what refers back (the parser to this reader, this reader
        to the connection) and the buffers, so no cycle keeps them alive."""
        self.parser = None
        self.sink = _GONE
        self._first, self._body = b"", bytearray()
        self.ready = None
        self._head = None

    @property
    def in_head(self) -> bool:
        """A request head has begun to arrive and is not complete yet."""
        return self.in_message and not self._headers_done

    def feed(self, data: bytes, pos: int) -> int:
        """Parse `data` from `pos` until a request is complete (`ready`), the data ends or the
        request is refused; returns where it stopped."""
        size = len(data)
        while pos < size and self.ready is None and not self.sink.closed:
            n = self._left if self._phase == _LENGTH and self._left > 0 else cut(self._tail, data, pos)
            end = min(size, pos + n)
            piece = data if pos == 0 and end == size else data[pos:end]  # (copies one request at most)
            pos = end
            phase = self._phase
            if phase == _LENGTH:
                self._left -= len(piece)
            else:
                self._tail = piece[-3:] if len(piece) >= 3 else (self._tail + piece)[-3:]
            try:
                self.parser.feed_data(piece)
            except httptools.HttpParserUpgrade:
                self._refuse(400, UPGRADE, "malformed")
            except httptools.HttpParserError:
                if self._head_too_large:
                    self._refuse(431, HEAD_TOO_LARGE, "head_too_large")
                else:
                    self._refuse(400, MALFORMED, "malformed")
            if self.sink.closed:
                break
            if phase == _HEAD and self.in_message and not self._headers_done:
                self._head_raw += len(piece)  # the parser holds an incomplete head: bound it
                if self._head_raw > MAX_HEAD_BYTES:
                    self._refuse(431, HEAD_TOO_LARGE, "head_too_large")
        return pos

    def _refuse(self, status: int, body: bytes, cause: str) -> None:
        self.ready = None
        if not self.sink.closed:
            self.limits.refuse(cause)
            self.sink.reject(status, body)

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._arrived = self.clock()
        self.in_message, self._headers_done = True, False
        self._url, self._headers, self._joined, self._repeated, self._lines = b"", {}, {}, "", 0
        self._first, self._body, self._size, self._too_large = b"", bytearray(), 0, False
        self._pieces, self._head, self.refusal = 0, None, None
        self._head_bytes, self._head_raw, self._head_too_large = 0, 0, False
        self.sink.message_begun()

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_bytes += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._lines += 1
        if self._lines > MAX_HEADER_COUNT:
            self._head_too_large = True
            raise _HeadTooLarge  # stops the parser: the rest of the head is never looked at
        if self._headers_done:
            return  # a trailer of a chunked body: read, never merged into the headers
        self._head_bytes += len(name) + len(value)
        if self._head_bytes > MAX_HEAD_BYTES:
            self._head_too_large = True
            raise _HeadTooLarge
        headers = self._headers
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        if key in headers:
            if key in SINGLE:
                self._repeated = key
            else:
                self._joined.setdefault(key, [headers[key]]).append(text)
        else:
            headers[key] = text

    def on_headers_complete(self) -> None:
        self._headers_done = True
        self._head_raw = 0
        self._tail = b""
        for key, values in self._joined.items():
            self._headers[key] = ", ".join(values)
        parser = self.parser
        if parser.should_upgrade():
            return  # answered by the upgrade exception (400)
        self.sink.head_done()
        version = parser.get_http_version()
        problem = self._check(self._headers, version)
        if problem is not None:
            status, body = problem
            self.limits.refuse("body_too_large" if status == 413 else "malformed")
            self.sink.reject(status, body)
            return
        expect = self._headers.get("expect")
        go_ahead = expect is not None and version == "1.1" and expect.lower() == "100-continue"
        if self.head_check is not None:
            self._head = head = self._request(b"")
            answer = self.head_check(head)
            if answer is not None:
                self._head, self.refusal = None, answer
                self.limits.refuse("head_refused")
                if go_ahead:
                    self.sink.reject(*answer)  # its body is not sent yet: no need for it
                return
        if go_ahead:
            self.sink.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl waits a second for this before a large body

    def _check(self, headers: dict[str, str], version: str) -> tuple[int, bytes] | None:
        """What is wrong with a complete head, if anything; sets how its body is framed."""
        if self._repeated:
            return 400, error_body(400, f"the {self._repeated} header is repeated")
        if version == "1.1" and "host" not in headers:
            return 400, NO_HOST
        coding = headers.get("transfer-encoding")
        length = 0
        if coding is not None:
            if coding.strip().lower() != "chunked":
                return 501, TRANSFER_CODING
            self._phase = _CHUNKED
        else:
            declared = headers.get("content-length")
            length = int(declared) if declared is not None and declared.strip().isdigit() else 0
            if length:
                self._phase, self._left = _LENGTH, length
        expect = headers.get("expect")
        if length > self.max_body_bytes and expect is not None:
            return 413, TOO_LARGE  # the client waits for a go-ahead: no need to read the body
        return None  # (a declared length reserves nothing: body bytes are counted as they arrive, on_body)

    def on_body(self, body: bytes) -> None:
        if self.sink.closed:
            return  # refused within this piece: the parser goes on calling until the piece ends
        size = self._size
        self._size = size + len(body)
        self._pieces += 1
        if self._pieces > TINY_PIECES_AFTER and self._size < self._pieces * MIN_PIECE_BYTES:
            self.sink.account(-size)  # what was kept goes now
            self._first, self._body = b"", bytearray()
            self._refuse(400, TINY_PIECES, "malformed")
            return
        if self._size > self.max_body_bytes:
            if not self._too_large:  # read on and drop, then 413: what was kept goes now
                self._too_large = True
                self.sink.account(-size)
                self._first, self._body = b"", bytearray()
            return
        if self.refusal is not None:
            return  # refused by its head: read and dropped
        if not self.sink.take(len(body)):  # counted as it arrives (the refusal is counted by cause)
            self.ready = None
            self.sink.reject(503, BUSY_BYTES)
            return
        if not size:
            self._first = body
            return
        if self._first:
            self._body += self._first
            self._first = b""
        self._body += body

    def on_message_complete(self) -> None:
        self.in_message, self._phase, self._tail, self._left = False, _HEAD, b"", 0
        parser = self.parser
        if self.sink.closed or parser.should_upgrade():
            return
        if self._too_large:
            self._refuse(413, TOO_LARGE, "body_too_large")
            return
        body = bytes(self._body) if self._body else self._first
        self._first, self._body = b"", bytearray()
        head, self._head = self._head, None
        if head is not None:
            head.body = body
            self.ready = head
        else:
            self.ready = self._request(body)
        self.keep_alive, self.head_only = parser.should_keep_alive(), parser.get_method() == b"HEAD"

    def _request(self, body: bytes) -> Request:
        """The request at hand as its head says (HEAD is served as GET: the responder sends the head only)."""
        url = self._url.decode("latin-1")
        if url.startswith("/") and "?" not in url and "#" not in url:
            path, query = url, {}  # the common case: a plain origin-form path
        else:
            parts = urlsplit(url)
            path, query = parts.path, parse_qs(parts.query)
        parser = self.parser
        method = parser.get_method().decode()
        return Request(method="GET" if method == "HEAD" else method, path=path, query=query, headers=self._headers,
                       body=body, peer=self.peer, http_version=parser.get_http_version(), arrived=self._arrived)
