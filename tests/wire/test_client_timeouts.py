"""wire.client against real loopback sockets: a server that never answers is a TimedOut
within the timeout (sync and async), a port nobody listens on is Unreachable, a health probe
of either is False."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import pytest

from wire import client
from wire.client import AsyncClient, TimedOut, Unreachable

pytestmark = pytest.mark.integration


@pytest.fixture
def silent() -> Iterator[str]:
    """A loopback listener whose backlog accepts connections that nobody ever answers."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"


@pytest.fixture
def closed() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_a_silent_server_times_out_with_the_limit_in_the_message(silent: str) -> None:
    started = time.monotonic()
    with pytest.raises(TimedOut, match=r"GET http://127\.0\.0\.1:\d+/metrics: nothing read within 0.2 s"):
        client.get_text(f"{silent}/metrics", timeout_s=0.2)
    assert time.monotonic() - started < 2
    assert client.healthy(silent, timeout_s=0.2) is False

    async def scrape() -> None:
        async with AsyncClient(silent, timeout_s=0.2) as c:
            await c.get_text("/metrics")

    with pytest.raises(TimedOut):
        asyncio.run(scrape())


def test_nobody_listening_is_unreachable(closed: str) -> None:
    with pytest.raises(Unreachable) as failed:
        client.get_json(f"{closed}/health")
    assert failed.value.kind == "ConnectError" and closed in str(failed.value)
    assert client.healthy(closed) is False
