"""The router's front door against clients that are careless or hostile (issue 15), on the real
router process in front of simulated engines: unread pipelining keeps its memory bounded, a
client that leaves at any point of a PD request leaves nothing held on either engine, a
half-closed client is answered, JSON too deep to forward is a 400, and the router's memory and
descriptors come back to where they were once the clients leave."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import time

import pytest

from tests.security.conftest import (
    LONG,
    MODEL,
    USER_KEY,
    Deployment,
    assert_openai_error,
    call,
    engine_state,
    open_fds,
    rss_mib,
)
from tests.support.engines import fault

pytestmark = pytest.mark.integration


def _steady_fds(pid: int, interval_s: float = 1.0, wait_s: float = 10.0) -> int:
    """The router's open files once they stop changing over two scrape intervals."""
    deadline = time.monotonic() + wait_s
    seen = open_fds(pid)
    while time.monotonic() < deadline:
        time.sleep(2 * interval_s)
        now = open_fds(pid)
        if now == seen:
            break
        seen = now
    return seen


def _post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return (b"POST %b HTTP/1.1\r\nhost: x\r\nauthorization: Bearer %b\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n%b\r\n%b" % (path.encode(), USER_KEY.encode(), len(body), extra, body))


def _settled(deployment: Deployment, names: tuple[str, ...], wait_s: float = 8.0) -> dict[str, tuple[float, float]]:
    deadline = time.monotonic() + wait_s
    while True:
        states = {n: engine_state(deployment.engines[n]) for n in names}
        if all(s == (0.0, 0.0) for s in states.values()) or time.monotonic() > deadline:
            return states
        time.sleep(0.1)


def test_unread_pipelining_keeps_the_router_memory_bounded(deployment: Deployment) -> None:
    pid = deployment.proc.pid
    _steady_fds(pid)  # the router's own keep-alive scrape connections, one per engine, are open
    before_rss, before_fds = rss_mib(pid), open_fds(pid)
    request = b"GET /openapi.json HTTP/1.1\r\nhost: x\r\n\r\n"
    socks = []
    for _ in range(4):
        sock = socket.create_connection((deployment.host, deployment.port), timeout=5)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
        sock.setblocking(False)
        socks.append(sock)
    deadline = time.monotonic() + 4
    sent = 0
    while time.monotonic() < deadline:  # send as fast as the router takes them; never read
        for sock in socks:
            with contextlib.suppress(BlockingIOError):
                sent += sock.send(request * 64)
        time.sleep(0.001)
    grown = rss_mib(pid) - before_rss
    assert grown < 64, f"router grew {grown:.0f} MiB under {sent // len(request)} unread pipelined requests"
    for sock in socks:
        sock.close()
    time.sleep(1.0)
    assert open_fds(pid) <= before_fds + 2  # the connections are gone


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("reset", [False, True])
def test_a_client_leaving_at_any_point_of_a_pd_request_leaves_nothing_held(
        deployment: Deployment, stream: bool, reset: bool) -> None:
    prefill, decode = deployment.engines["p1"], deployment.engines["d1"]
    for engine in (prefill, decode):
        fault(engine, {"slowdown": 400})  # about 40 % of real time: prefill and decode take tens of ms
    try:
        body = json.dumps({"model": MODEL, "prompt": LONG + "leave", "max_tokens": 12, "stream": stream}).encode()
        for delay_s in (0.0, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16):
            sock = socket.create_connection((deployment.host, deployment.port), timeout=5)
            sock.sendall(_post("/v1/completions", body, b"x-slo-class: interactive\r\n"))
            time.sleep(delay_s)
            if reset:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
        states = _settled(deployment, ("p1", "d1"))
        assert states == {"p1": (0.0, 0.0), "d1": (0.0, 0.0)}, states  # no request running, no KV held
    finally:
        for engine in (prefill, decode):
            fault(engine, {"clear": True})
    _status, _, replicas = call(deployment.base + "/admin/replicas", key="sk-isle-test-admin-9b1d3f5e7a")
    states_r = json.loads(replicas)["replicas"]
    assert not any(r["breaker_open"] for r in states_r) and sum(r["inflight"] for r in states_r) == 0


def test_a_half_closed_client_is_answered(deployment: Deployment) -> None:
    body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 3}).encode()
    with socket.create_connection((deployment.host, deployment.port), timeout=10) as sock:
        sock.sendall(_post("/v1/completions", body))
        sock.shutdown(socket.SHUT_WR)
        reply = b""
        while part := sock.recv(65536):
            reply += part
    final = reply[reply.rindex(b"HTTP/1.1 "):]  # after any interim 100 Continue
    assert final.startswith(b"HTTP/1.1 200") and b'"text_completion"' in final


@pytest.mark.parametrize("depth", [254, 300, 1000, 5000])
def test_json_too_deep_to_forward_is_a_400(deployment: Deployment, depth: int) -> None:
    nested = "[" * depth + "]" * depth
    body = f'{{"model": "{MODEL}", "prompt": "x", "max_tokens": 1, "user_meta": {nested}}}'.encode()
    status, _, reply = call(deployment.base + "/v1/completions", body)
    if depth < 254:
        assert status == 200
    else:
        assert_openai_error(status, reply, 400)
