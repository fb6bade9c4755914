"""`python -m router bench --front-door`: the issue-15 attacks, run the same way against this
project's connection layer (wire.http) and the maintained candidates (uvicorn's httptools
protocol, granian), each serving the same echo app on loopback. One row per probe: what the app
was handed or what the client got, and whether that is what nginx would do.

`python -m router.bench.probes --serve PORT` runs our side (the echo handler on wire.http).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import time
from collections.abc import Callable
from pathlib import Path

from wire.http import serve
from wire.reader import Request
from wire.responder import Responder

Probe = Callable[[int], str]
"""A probe against a server on 127.0.0.1:PORT; returns 'ok' or what went wrong, in a few words."""


def _exchange(port: int, data: bytes, half_close: bool = False, wait_s: float = 3.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        got = b""
        with contextlib.suppress(TimeoutError, ConnectionError):
            while part := sock.recv(65536):
                got += part
        return got


def _finals(got: bytes) -> list[bytes]:
    return [line for line in got.split(b"\r\n") if line.startswith(b"HTTP/1.") and b" 100 " not in line]


def trailer_override(port: int) -> str:
    got = _exchange(port, b"POST /x HTTP/1.1\r\nhost: a\r\nauthorization: Bearer wrong\r\n"
                          b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
                          b"1\r\na\r\n0\r\nauthorization: Bearer right\r\n\r\n")
    return "trailer added to the headers" if b"right" in got else "ok"


def missing_host(port: int) -> str:
    got = _exchange(port, b"GET /x HTTP/1.1\r\nconnection: close\r\n\r\n")
    return "ok" if got.startswith(b"HTTP/1.1 400") else "served without Host"


def gzip_chunked(port: int) -> str:
    got = _exchange(port, b"POST /x HTTP/1.1\r\nhost: a\r\ntransfer-encoding: gzip, chunked\r\n"
                          b"connection: close\r\n\r\n1\r\na\r\n0\r\n\r\n")
    return "ok" if got[9:12] in (b"400", b"501") else f"accepted ({got[9:12].decode() or 'closed'})"


def repeated_authorization(port: int) -> str:
    got = _exchange(port, b"GET /x HTTP/1.1\r\nhost: a\r\nauthorization: Bearer a\r\nauthorization: Bearer b\r\n"
                          b"connection: close\r\n\r\n")
    return "ok" if got.startswith(b"HTTP/1.1 400") else "accepted"


def upgrade(port: int) -> str:
    got = _exchange(port, b"GET /x HTTP/1.1\r\nhost: a\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n")
    finals = _finals(got)
    return "ok" if len(finals) == 1 else f"{len(finals)} responses"


def http10_stream(port: int) -> str:
    got = _exchange(port, b"GET /stream HTTP/1.0\r\n\r\n")
    head = got.partition(b"\r\n\r\n")[0].lower()
    return "chunked to HTTP/1.0" if b"transfer-encoding: chunked" in head else "ok"


def half_close(port: int) -> str:
    got = _exchange(port, b"GET /x HTTP/1.1\r\nhost: a\r\n\r\n", half_close=True)
    return "ok" if _finals(got) == [b"HTTP/1.1 200 OK"] else "no answer"


def continue_mid_response(port: int) -> str:
    got = _exchange(port, b"GET /slow HTTP/1.1\r\nhost: a\r\n\r\nPOST /x HTTP/1.1\r\nhost: a\r\ncontent-length: 1\r\n"
                          b"expect: 100-continue\r\nconnection: close\r\n\r\na")
    first = got.find(b"HTTP/1.1 200")
    cont = got.find(b"100 Continue")
    return "100 Continue before the first response" if 0 <= cont < first else "ok"


def unread_pipelining(port: int, pid: int) -> str:
    """MiB the server process tree grew by under 4 s of pipelined GETs of a 20 KB answer, unread."""
    before = _rss_tree_mib(pid)
    socks = []
    for _ in range(4):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
        sock.setblocking(False)
        socks.append(sock)
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        for sock in socks:
            with contextlib.suppress(BlockingIOError):
                sock.send(b"GET /big HTTP/1.1\r\nhost: a\r\n\r\n" * 64)
        time.sleep(0.001)
    grown = _rss_tree_mib(pid) - before
    for sock in socks:
        sock.close()
    return f"+{grown:.0f} MiB"


def _rss_tree_mib(pid: int) -> float:
    from router.bench.load import tree_pids

    total = 0
    for p in tree_pids(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total / 1024


PROBES: dict[str, Probe] = {
    "chunked trailer overrides Authorization": trailer_override,
    "HTTP/1.1 without Host": missing_host,
    "Transfer-Encoding: gzip, chunked": gzip_chunked,
    "two Authorization headers": repeated_authorization,
    "Upgrade: one response": upgrade,
    "stream to an HTTP/1.0 client": http10_stream,
    "half-closed client answered": half_close,
    "100 Continue inside another response": continue_mid_response,
}


def run_probes(port: int, pid: int) -> dict[str, str]:
    results = {name: probe(port) for name, probe in PROBES.items()}
    results["memory under unread pipelining"] = unread_pipelining(port, pid)
    return results


async def _echo(request: Request, response: Responder) -> None:
    if request.path == "/stream":
        response.start_stream(200, "text/plain")
        for i in range(3):
            await response.write(b"part%d;" % i)
        response.end()
        return
    if request.path == "/slow":
        await asyncio.sleep(0.2)
    body = b"x" * 20000 if request.path == "/big" else json.dumps(request.headers).encode()
    response.send(200, body)


async def _serve(port: int) -> None:
    server = await serve(_echo, "127.0.0.1", port)
    print("ready:", flush=True)
    await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m router.bench.probes")
    parser.add_argument("--serve", type=int, required=True, help="port for the echo app on wire.http")
    import uvloop

    uvloop.run(_serve(parser.parse_args().serve))


if __name__ == "__main__":
    main()
