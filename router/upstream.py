"""A pooled HTTP/1.1 client for engines on loopback: keep-alive connections per replica, a
connect deadline, a first-byte deadline, and bodies read as they come (streams are relayed
chunk by chunk, never re-serialised).

    UpstreamError     nothing usable came back (connect refused, reset, timeout, bad HTTP):
                      the request may be retried on another replica, no byte went to the client
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field


class UpstreamError(Exception):
    pass


@dataclass(slots=True)
class Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


@dataclass(slots=True)
class UpstreamResponse:
    status: int
    headers: dict[str, str]
    conn: Connection
    pool: Pool
    key: str
    idle_timeout_s: float
    done: bool = False
    reusable: bool = field(default=False)

    async def _line(self) -> bytes:
        try:
            async with asyncio.timeout(self.idle_timeout_s):  # no extra task per read, unlike wait_for
                return await self.conn.reader.readline()
        except (TimeoutError, OSError, asyncio.IncompleteReadError) as err:
            raise UpstreamError(f"upstream stalled or reset mid-body ({type(err).__name__})") from None

    async def _exactly(self, n: int) -> bytes:
        try:
            async with asyncio.timeout(self.idle_timeout_s):
                return await self.conn.reader.readexactly(n)
        except (TimeoutError, OSError, asyncio.IncompleteReadError) as err:
            raise UpstreamError(f"upstream stalled or reset mid-body ({type(err).__name__})") from None

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (chunked payloads, or up to 64 KiB pieces of a sized body)."""
        try:
            if self.headers.get("transfer-encoding", "").lower() == "chunked":
                while True:
                    size_line = await self._line()
                    try:
                        size = int(size_line.split(b";")[0].strip(), 16)
                    except ValueError:
                        raise UpstreamError("bad chunk framing from upstream") from None
                    if size == 0:
                        await self._line()
                        break
                    data = await self._exactly(size)
                    await self._exactly(2)
                    yield data
            else:
                left = int(self.headers.get("content-length", "0") or 0)
                while left > 0:
                    data = await self._exactly(min(left, 65536))
                    left -= len(data)
                    yield data
            self.reusable = self.headers.get("connection", "keep-alive").lower() != "close"
        finally:
            self.release()

    async def body(self) -> bytes:
        return b"".join([c async for c in self.chunks()])

    def release(self) -> None:
        if self.done:
            return
        self.done = True
        if self.reusable:
            self.pool.put(self.key, self.conn)
        else:
            self.conn.close()


class Pool:
    def __init__(self, connect_timeout_s: float = 2.0, max_idle_per_host: int = 64) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.max_idle = max_idle_per_host
        self.idle: dict[str, list[Connection]] = {}

    def put(self, key: str, conn: Connection) -> None:
        bucket = self.idle.setdefault(key, [])
        if len(bucket) < self.max_idle and not conn.writer.is_closing():
            bucket.append(conn)
        else:
            conn.close()

    async def _connect(self, host: str, port: int) -> Connection:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), self.connect_timeout_s)
        except (OSError, TimeoutError) as err:
            raise UpstreamError(f"cannot connect to {host}:{port} ({type(err).__name__})") from None
        return Connection(reader, writer)

    async def request(self, base: str, method: str, path: str, body: bytes, headers: dict[str, str],
                      first_byte_timeout_s: float, idle_timeout_s: float) -> UpstreamResponse:
        hostport = base.removeprefix("http://")
        host, _, port = hostport.rpartition(":")
        head = [f"{method} {path} HTTP/1.1", f"host: {hostport}", f"content-length: {len(body)}",
                "connection: keep-alive", *(f"{k}: {v}" for k, v in headers.items())]
        raw = ("\r\n".join(head) + "\r\n\r\n").encode() + body
        for attempt in range(2):  # a pooled connection the engine closed meanwhile: one fresh retry
            bucket = self.idle.get(hostport)
            reused = attempt == 0 and bool(bucket)
            conn = bucket.pop() if reused and bucket else await self._connect(host, int(port))
            try:
                conn.writer.write(raw)
                async with asyncio.timeout(first_byte_timeout_s):
                    status_line = await conn.reader.readline()
                if not status_line:
                    raise ConnectionResetError("closed before the status line")
                headers_in = await self._headers(conn)
            except TimeoutError:
                conn.close()
                raise UpstreamError(f"no response from {hostport} within {first_byte_timeout_s:g} s") from None
            except (OSError, asyncio.IncompleteReadError) as err:
                conn.close()
                if attempt == 0 and reused:
                    continue
                raise UpstreamError(f"{hostport} reset the connection ({type(err).__name__})") from None
            except BaseException:  # cancelled (the router is stopping): do not leave the socket open
                conn.close()
                raise
            parts = status_line.split()
            if len(parts) < 2 or not parts[1].isdigit():
                conn.close()
                raise UpstreamError(f"{hostport} sent no HTTP status line")
            return UpstreamResponse(status=int(parts[1]), headers=headers_in, conn=conn, pool=self, key=hostport,
                                    idle_timeout_s=idle_timeout_s)
        raise UpstreamError(f"{hostport} closed the connection twice")

    @staticmethod
    async def _headers(conn: Connection) -> dict[str, str]:
        out: dict[str, str] = {}
        while True:
            line = await conn.reader.readline()
            if line in (b"\r\n", b"\n", b""):
                return out
            name, _, value = line.decode("latin-1").partition(":")
            out[name.strip().lower()] = value.strip()

    def close(self) -> None:
        for bucket in self.idle.values():
            for conn in bucket:
                conn.close()
        self.idle.clear()
