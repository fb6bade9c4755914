"""The lean HTTP/1.1 server both the engine and the router serve through, spoken to over raw
loopback sockets: HEAD, Expect: 100-continue, pipelining in order (errors included), read
back-pressure, and the read and idle timeouts."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from wire import http
from wire.limits import ServerLimits
from wire.reader import Request
from wire.responder import Responder

pytestmark = pytest.mark.integration


async def _echo(request: Request, response: Responder) -> None:
    if request.path == "/slow":
        await asyncio.sleep(0.2)
    response.send(200, f"{request.method} {request.path} {len(request.body)}".encode(), "text/plain")


def _run(scenario: Callable[[int], Awaitable[None]], limits: ServerLimits | None = None) -> None:
    async def main() -> None:
        server = await http.serve(_echo, "127.0.0.1", 0, limits=limits)
        port = server.sockets[0].getsockname()[1]
        try:
            await asyncio.wait_for(scenario(port), 10)
        finally:
            server.close()
    asyncio.run(main())


async def _read_all(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.read(-1), 5)


def test_head_has_headers_only_and_expect_continue_is_answered() -> None:
    async def scenario(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /x HTTP/1.1\r\nhost: a\r\ncontent-length: 3\r\nexpect: 100-continue\r\n\r\n")
        assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"abc")
        writer.write(b"HEAD /x HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n")
        data = await _read_all(reader)
        first, second = data.split(b"HTTP/1.1 200 OK")[1:]
        assert first.endswith(b"\r\n\r\nPOST /x 3")
        assert b"content-length: 8" in second and second.endswith(b"\r\n\r\n")  # length of the GET body, no body
        writer.close()
    _run(scenario)


def test_pipelined_requests_and_a_malformed_one_are_answered_in_order() -> None:
    async def scenario(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /slow HTTP/1.1\r\nhost: a\r\n\r\nGET /b HTTP/1.1\r\nhost: a\r\n\r\n"
                     b"BLAH\x00 nonsense\r\n\r\n")
        data = await _read_all(reader)
        assert data.index(b"GET /slow 0") < data.index(b"GET /b 0") < data.index(b"HTTP/1.1 400")
        writer.close()
    _run(scenario)


def test_many_pipelined_requests_pause_and_resume_reading_without_loss() -> None:
    async def scenario(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        count = 2500  # the issue-15 burst: every one answered, in order
        writer.write(b"".join(b"GET /r%d HTTP/1.1\r\nhost: a\r\n\r\n" % i for i in range(count)))
        writer.write(b"GET /last HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n")
        data = await _read_all(reader)
        positions = [data.index(b"GET /r%d 0" % i) for i in range(count)]
        assert positions == sorted(positions) and data.endswith(b"GET /last 0")
        writer.close()
    _run(scenario)


def test_a_request_that_never_finishes_arriving_gets_408(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http, "READ_TIMEOUT_S", 0.2)

    async def scenario(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /x HTTP/1.1\r\nhost: a\r\ncontent-length: 100\r\n\r\nonly part")
        data = await _read_all(reader)
        assert data.startswith(b"HTTP/1.1 408")
        writer.close()
    _run(scenario)


def test_an_idle_keep_alive_connection_is_closed() -> None:
    async def scenario(port: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /a HTTP/1.1\r\nhost: a\r\n\r\n")
        data = await _read_all(reader)  # the answer, then the server closes the idle connection
        assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"GET /a 0")
        writer.close()
    _run(scenario, ServerLimits(idle_timeout_s=0.2))
