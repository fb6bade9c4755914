"""The live driver's HTTP/1.1 client on asyncio streams: keep-alive connections to one loopback
target, chunked bodies decoded from reads of any size, each piece timed as it is read."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import orjson

READ_BYTES = 1 << 16


class UsageError(Exception):
    """A command line we refuse (exit 2): a non-loopback target, a bad workload or classes file."""


def loopback_target(url: str) -> tuple[str, int]:
    """(host, port) of an http://HOST:PORT[/v1] URL whose host is a loopback address."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme != "http":
        raise UsageError(f"target {url!r}: only http:// targets are supported")
    host = parts.hostname or ""
    try:
        addr = ipaddress.ip_address(host)
        mapped = addr.ipv4_mapped if isinstance(addr, ipaddress.IPv6Address) else None
        loopback = addr.is_loopback or bool(mapped and mapped.is_loopback)
    except ValueError:
        loopback = host.lower() == "localhost"
    if not loopback:
        raise UsageError(f"refusing target {url!r}: host {host or '(none)'} is not a loopback address "
                         "(127.0.0.0/8, ::1 or localhost); load tests only run against this machine")
    try:
        port = parts.port or 80
    except ValueError:
        raise UsageError(f"target {url!r}: bad port") from None
    return host, port


def sse_payloads(pending: bytes, data: bytes) -> tuple[bytes, list[bytes]]:
    """The `data:` payloads of the SSE lines that `pending + data` completes, and the unfinished
    rest (kept for the next read)."""
    lines = (pending + data).split(b"\n")
    rest = lines.pop()
    return rest, [line[5:].strip() for line in lines if line.startswith(b"data:")]


@dataclasses.dataclass(slots=True)
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class _Dechunker:
    """Chunked transfer coding, decoded from reads of any size."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.left = -1  # bytes of chunk data still to come, -1: a size line is next, -2: trailers
        self.done = False

    def feed(self, data: bytes) -> bytes:
        self.buf += data
        out = bytearray()
        while not self.done:
            if self.left > 0:
                take = min(self.left, len(self.buf))
                out += self.buf[:take]
                del self.buf[:take]
                self.left -= take
                if self.left:
                    break
                self.left = 0
            end = self.buf.find(b"\r\n")
            if end < 0:
                break
            line = bytes(self.buf[:end])
            del self.buf[: end + 2]
            if self.left == 0:  # the CRLF after a chunk's data
                self.left = -1
            elif self.left == -2:  # trailers until an empty line
                self.done = not line
            else:
                size = int(line.split(b";")[0].strip() or b"x", 16)
                self.left = size if size else -2
        return bytes(out)


class Target:
    """A keep-alive connection pool to one host:port."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.idle: list[_Conn] = []

    async def request(self, raw: bytes) -> tuple[_Conn, int, dict[str, str]]:
        """Send one request; (connection, status, lower-cased headers). A pooled connection the
        server closed meanwhile is replaced once."""
        for attempt in range(2):
            reused = attempt == 0 and bool(self.idle)
            conn = self.idle.pop() if reused else _Conn(*await asyncio.open_connection(self.host, self.port))
            try:
                conn.writer.write(raw)
                status_line = await conn.reader.readline()
                if not status_line:
                    raise ConnectionResetError("closed before the status line")
                headers: dict[str, str] = {}
                while (line := await conn.reader.readline()) not in (b"\r\n", b"\n", b""):
                    name, _, value = line.decode("latin-1").partition(":")
                    headers[name.strip().lower()] = value.strip()
                return conn, int(status_line.split()[1]), headers
            except (OSError, asyncio.IncompleteReadError):
                conn.close()
                if not reused:
                    raise
            except BaseException:
                conn.close()
                raise
        raise ConnectionResetError("closed twice")

    async def body(self, conn: _Conn, headers: dict[str, str], sink: Callable[[bytes, float], None]) -> None:
        """Read the body, handing each decoded piece to `sink` with the time it was read; the
        connection goes back to the pool when the server keeps it."""
        keep = headers.get("connection", "").lower() != "close"
        if headers.get("transfer-encoding", "").lower() == "chunked":
            chunks = _Dechunker()
            while not chunks.done:
                data = await conn.reader.read(READ_BYTES)
                if not data:
                    raise ConnectionResetError("closed mid-body")
                if piece := chunks.feed(data):
                    sink(piece, time.perf_counter())
            keep = keep and not chunks.buf
        elif "content-length" in headers:
            sink(await conn.reader.readexactly(int(headers["content-length"])), time.perf_counter())
        else:
            while data := await conn.reader.read(READ_BYTES):
                sink(data, time.perf_counter())
            keep = False
        if keep:
            self.idle.append(conn)
        else:
            conn.close()

    async def get_json(self, path: str, key: str) -> tuple[int, Any]:
        raw = (f"GET {path} HTTP/1.1\r\nhost: {self.authority}\r\nauthorization: Bearer {key}\r\n"
               "content-length: 0\r\n\r\n").encode()
        conn, status, headers = await self.request(raw)
        parts: list[bytes] = []
        await self.body(conn, headers, lambda b, _: parts.append(b))
        try:
            return status, orjson.loads(b"".join(parts))
        except orjson.JSONDecodeError:
            return status, None

    def close(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle.clear()
