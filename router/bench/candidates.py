"""The maintained servers measured as the router's data plane (issue 15's decision): uvicorn (its
httptools protocol on uvloop) and granian (hyper's HTTP/1.1 in Rust), each serving an ASGI app.

`proxy` is the floor of a router on that server: it forwards every request to the backends
(round robin) through this project's own relay (router.relay, the same raw upstream code the
router uses) and relays the answer chunk by chunk, with no keys, admission, routing decision or
metrics. Whatever it costs per request, a router on that server costs more. `echo` answers the
front-door probes (router.bench.probes) with what the server handed the app.

The servers install into `.bench/servers` (pip --target), never into the project's environment.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from router.relay import RelayPool, request_bytes
from router.upstream import UpstreamError

SERVERS = Path(".bench") / "servers"
PINS = ("uvicorn==0.54.0", "granian==2.8.7")
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def ensure_servers() -> dict[str, str]:
    """The environment that runs our Python with the candidates importable."""
    if not (SERVERS / "granian").exists() or not (SERVERS / "uvicorn").exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(SERVERS), *PINS], check=True)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(SERVERS.resolve()), os.getcwd()])}


def command(server: str, app: str, port: int, workers: int) -> list[str]:
    target = f"router.bench.candidates:{app}"
    if server == "uvicorn":
        return [sys.executable, "-m", "uvicorn", target, "--host", "127.0.0.1", "--port", str(port), "--workers",
                str(workers), "--http", "httptools", "--loop", "uvloop", "--no-access-log", "--log-level", "warning"]
    return [sys.executable, "-m", "granian", "--interface", "asgi", "--host", "127.0.0.1", "--port", str(port),
            "--workers", str(workers), "--loop", "uvloop", "--http", "1", "--no-ws", "--log-level", "warning", target]


class _Bridge:
    """relay.Listener -> an asyncio queue the ASGI coroutine reads."""

    def __init__(self) -> None:
        self.conn: Any = None
        self.queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    def on_head(self, status: int, content_type: str) -> None:
        self.queue.put_nowait(("head", (status, content_type)))

    def on_body(self, data: bytes) -> None:
        self.queue.put_nowait(("body", data))

    def flush(self) -> None:
        pass

    def on_done(self) -> None:
        self.queue.put_nowait(("done", None))

    def on_error(self, error: UpstreamError) -> None:
        self.queue.put_nowait(("error", str(error)))


@functools.cache
def _relay() -> RelayPool:
    """One relay per worker process, made on the first request (inside the server's loop)."""
    return RelayPool()


_turn = itertools.count()
_JSON = b"content-type: application/json\r\n"


async def proxy(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    pool = _relay()
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    backends = os.environ["ISLE_BENCH_BACKENDS"].split(",")
    base = backends[next(_turn) % len(backends)]
    bridge = _Bridge()
    pool.send(base, request_bytes(base, scope["method"], scope["path"], b"".join(chunks), _JSON), bridge)
    kind, value = await bridge.queue.get()
    if kind != "head":
        await send({"type": "http.response.start", "status": 502, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    status, content_type = value
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type.encode())]})
    while True:
        kind, value = await bridge.queue.get()
        if kind == "body":
            await send({"type": "http.response.body", "body": value, "more_body": True})
        else:
            await send({"type": "http.response.body", "body": b""})
            return


async def echo(scope: Scope, receive: Receive, send: Send) -> None:
    """What the probes ask: the headers the app was given, a stream, or a 20 KB body."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    path = scope["path"]
    if path == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        for i in range(3):
            await send({"type": "http.response.body", "body": b"part%d;" % i, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    if path == "/slow":
        await asyncio.sleep(0.2)
    body = b"x" * 20000 if path == "/big" else json.dumps(
        {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
