"""Issue 28's front-door attacks on the real router (`python -m router --config`, two workers on
one port) in front of a simulated engine, from other loopback addresses than the legitimate
client's (127.0.0.1): heads that declare large bodies, a crowd of idle connections from one
address, bodies in 2-byte chunks, bodies without a key. Done when 13 KB of unauthenticated
traffic refuses no legitimate request, bodies without a key are never buffered (refused by their
head, 401), the router's memory stays within its caps, and every refusal is in /metrics by cause,
whichever worker answers the scrape. The caps are the defaults scaled down
(8 MiB buffered per worker instead of 512 MiB, 256 KiB bodies instead of 4 MiB)."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from router.config import DEV_ADMIN_KEY, DEV_KEY, sha256
from tests.security.conftest import rss_mib
from tests.support.engines import running_router, start_engine, stop_engine
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration
MODEL = "llama-3.1-8b"
MAX_BODY_BYTES = 256 * 1024


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    engine = start_engine("--model", MODEL, "--gpu", "h100-sxm", "--time-scale", "0.01")
    try:
        config = {"port": 0, "workers": 2, "keys": [{"tenant": "dev", "key_sha256": sha256(DEV_KEY)}],
                  "admin_keys": [{"tenant": "ops", "key_sha256": sha256(DEV_ADMIN_KEY)}],
                  "pd": {"enabled": False}, "max_body_bytes": MAX_BODY_BYTES, "read_timeout_s": 10,
                  "max_buffered_bytes": 8 << 20, "max_connections": 1024, "max_client_connections": 100,
                  "replicas": [{"replica_id": "e1", "url": engine.base, "model": MODEL}]}
        with running_router(config, tmp_path_factory.mktemp("router")) as (proc, url):
            yield {"base": url.removesuffix("/v1"), "port": int(url.rsplit(":", 1)[1].split("/")[0]),
                   "pids": [proc.pid, *_children(proc.pid)]}
    finally:
        stop_engine(engine)


def _children(pid: int) -> list[int]:
    return [int(p) for task in Path(f"/proc/{pid}/task").iterdir() for p in (task / "children").read_text().split()]


def _connect(port: int, source: str) -> socket.socket:
    sock = socket.socket()
    sock.bind((source, 0))
    sock.settimeout(5)
    sock.connect(("127.0.0.1", port))
    return sock


def _legitimate(base: str) -> int:
    """One authenticated completion from 127.0.0.1, on a fresh connection: its status."""
    body = json.dumps({"model": MODEL, "prompt": "hello " * 200, "max_tokens": 4}).encode()
    req = urllib.request.Request(f"{base}/v1/completions", data=body, headers={
        "authorization": f"Bearer {DEV_KEY}", "content-type": "application/json", "connection": "close"})
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def _all_legitimate(base: str, count: int) -> list[int]:
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda _: _legitimate(base), range(count)))


def _front_door(base: str) -> dict[str, float]:
    """The router's isle_router_front_door_* series (a fresh connection: either worker answers)."""
    req = urllib.request.Request(f"{base}/metrics", headers={"connection": "close"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        text = resp.read().decode()
    out = {f"refused:{c}": float(v) for c, v in
           re.findall(r'^isle_router_front_door_refusals_total\{cause="(\w+)"\} (\S+)$', text, re.M)}
    for name in ("connections", "buffered_bytes"):
        found = re.search(rf"^isle_router_front_door_{name} (\S+)$", text, re.M)
        assert found is not None, text[-2000:]
        out[name] = float(found.group(1))
    return out


def _refused(sock: socket.socket) -> bool:
    """The router answered 503 (a refused connection) rather than waiting for a request."""
    sock.setblocking(False)
    try:
        return sock.recv(64).startswith(b"HTTP/1.1 503")
    except BlockingIOError:
        return False


def test_13_kb_of_heads_declaring_large_bodies_refuses_no_legitimate_request(router: dict[str, Any]) -> None:
    """Issue 28: 130 heads declaring 4 MiB reserved the 512 MiB cap; 147 of 147 POSTs got 503."""
    head = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    heads = [_connect(router["port"], "127.0.0.2") for _ in range(130)]
    try:
        for sock in heads:
            sock.sendall(head % MAX_BODY_BYTES)
        assert sum(len(head % MAX_BODY_BYTES) for _ in heads) < 13_500
        time.sleep(0.3)
        assert _all_legitimate(router["base"], 24) == [200] * 24
        seen = _front_door(router["base"])
        assert seen["buffered_bytes"] < 64 * 1024  # the heads hold nothing; only requests under way count
        assert seen["refused:buffered_bytes"] == seen["refused:client_buffered_bytes"] == 0
    finally:
        for sock in heads:
            sock.close()


def test_idle_connections_from_one_address_refuse_no_legitimate_request(router: dict[str, Any]) -> None:
    """Issue 28: 9,900 idle connections from one client took the connection cap. Here one address
    gets at most 100 per worker; the rest are refused (503) and counted, whichever worker saw them."""
    before = _front_door(router["base"])
    idle: list[socket.socket] = []
    try:
        for _ in range(400):
            idle.append(_connect(router["port"], "127.0.0.3"))
        got = [False] * len(idle)

        def refusals() -> int | None:
            """The 503s come as each worker sees its connections (later on a busy machine): the
            count once it reaches its least and the router's own count agrees with it."""
            for i, sock in enumerate(idle):
                got[i] = got[i] or _refused(sock)
            n = sum(got)
            counted = _front_door(router["base"])["refused:client_connections"] - before["refused:client_connections"]
            return n if n >= 200 and counted == n else None

        refused: int = wait_until(refusals, 20, "at least 200 of 400 refused, as the router counts them",
                                  interval_s=0.2)
        assert refused < 400
        assert _all_legitimate(router["base"], 24) == [200] * 24
        for _scrape in range(4):  # either worker answers: one sum
            seen = _front_door(router["base"])
            assert seen["refused:client_connections"] - before["refused:client_connections"] == refused
            assert seen["refused:connections"] == 0
    finally:
        for sock in idle:
            sock.close()


def test_bodies_in_small_chunks_cost_about_what_their_bytes_cost(router: dict[str, Any]) -> None:
    """Issue 28: 2-byte chunks cost ~28x their counted size (10 connections: 61 -> 1,179 MiB).
    Now such a body is refused after 1,024 pieces (400), and chunks of 128 bytes, twice the smallest
    average kept, cost about their bytes."""
    head = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer %b\r\n"
            b"transfer-encoding: chunked\r\n\r\n" % DEV_KEY.encode())  # (without a key: refused by its head, 401)
    with socket.create_connection(("127.0.0.1", router["port"]), timeout=10) as tiny:
        tiny.sendall(head + b"2\r\nzz\r\n" * 4096)
        assert tiny.recv(4096).startswith(b"HTTP/1.1 400")
    per_body = MAX_BODY_BYTES - 8 * 1024
    body = (b"80\r\n" + b"z" * 128 + b"\r\n") * (per_body // 128)  # never the last chunk: the bodies stay held
    time.sleep(0.5)
    before = rss_mib(*router["pids"])
    socks = [_connect(router["port"], f"127.0.0.{10 + i}") for i in range(10)]
    try:
        for sock in socks:
            sock.sendall(head + body)
        held: float = wait_until(lambda: (b := _front_door(router["base"])["buffered_bytes"]) >= 10 * per_body and b,
                                 10, "every body held", interval_s=0.1)
        grown = rss_mib(*router["pids"]) - before
        counted = held / (1 << 20)
        assert grown < 2 * counted + 4, f"router grew {grown:.1f} MiB for {counted:.1f} MiB of counted body"
    finally:
        for sock in socks:
            sock.close()
    assert _all_legitimate(router["base"], 4) == [200] * 4


def test_bodies_without_a_key_never_fill_the_buffered_bytes_cap(router: dict[str, Any]) -> None:
    """P1: 9 addresses x 16 connections each sending 4 MiB-1 of a body with no key (never
    finishing it) held the 512 MiB cap: 18 of 20 legitimate POSTs got 503 (the key was checked
    once the whole request was read). Now a request with a body and no valid key is refused by its
    head: its body is read and dropped, and 401 is its answer. Scaled: 9 x 16 bodies of 200 KiB
    (28 MiB) against 8 MiB per worker; before the fix they filled both workers' caps and some
    legitimate requests got 503."""
    before = _front_door(router["base"])
    head = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    socks = [_connect(router["port"], f"127.0.0.{20 + i}") for i in range(9) for _ in range(16)]
    try:
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.sendall(head % (MAX_BODY_BYTES - 1) + b"a" * 200 * 1024)
        statuses, most = [], 0.0
        for _round in range(5):  # topped up in 256-byte pieces, as the attack did
            for sock in socks:
                with contextlib.suppress(OSError):
                    sock.send(b"a" * 256)
            most = max(most, _front_door(router["base"])["buffered_bytes"])
            statuses += _all_legitimate(router["base"], 4)
        assert statuses == [200] * 20
        assert most < 64 * 1024  # only legitimate requests under way count
        seen = _front_door(router["base"])
        assert seen["refused:head_refused"] - before["refused:head_refused"] == len(socks)
        assert seen["refused:buffered_bytes"] == seen["refused:client_buffered_bytes"] == 0
    finally:
        for sock in socks:
            sock.close()
