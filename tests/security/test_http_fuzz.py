"""A stateful HTTP fuzzer over raw loopback sockets against the real router (in front of a mixed
replica and a prefill/decode pair): hypothesis drives several connections at once, each
pipelining requests of many shapes (plain, streamed, PD, chunked with trailers, 100-continue,
HTTP/1.0, oversized heads and bodies, bad chunk sizes, repeated or ambiguous headers), written
whole or in pieces, read partly, slowly, or not at all, half-closed or dropped.

Invariants, checked by an independent parser (h11) and the router's and engines' own views:
every request gets exactly one well-formed response, in order, with the status its shape calls
for — or, after a response that closes the connection, a clean close; and after each run, once
the clients have left: no breaker opened, no request in flight in the router, nothing running or
held on any engine, the router's descriptors back to the baseline and its memory within bounds.
Bounded: a few dozen runs of a few steps, loopback only."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import time
from dataclasses import dataclass, field

import h11
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from tests.security.conftest import (
    ADMIN_KEY,
    LONG,
    MAX_BODY_BYTES,
    MODEL,
    USER_KEY,
    Deployment,
    call,
    engine_ports,
    engine_state,
    fds_held,
    rss_mib,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@dataclass(frozen=True)
class Shape:
    """A request as bytes, the status the router must answer it with, and whether the router
    closes the connection after it."""

    name: str
    raw: bytes = field(repr=False)
    method: str
    status: int
    closes: bool = False


def _post(path: str, body: dict[str, object] | bytes, key: str = USER_KEY, extra: bytes = b"") -> bytes:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return (b"POST %b HTTP/1.1\r\nhost: x\r\nauthorization: Bearer %b\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n%b\r\n%b" % (path.encode(), key.encode(), len(data), extra, data))


def _chunked(path: str, body: bytes, trailers: bytes, key: str) -> bytes:
    half = len(body) // 2
    return (b"POST %b HTTP/1.1\r\nhost: x\r\nauthorization: Bearer %b\r\ntransfer-encoding: chunked\r\n\r\n"
            b"%x\r\n%b\r\n%x;ext=1\r\n%b\r\n0\r\n%b\r\n" % (path.encode(), key.encode(), half, body[:half],
                                                            len(body) - half, body[half:], trailers))


COMPLETION = {"model": MODEL, "prompt": "fuzz", "max_tokens": 3}
SHAPES = [
    Shape("health", b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n", "GET", 200),
    Shape("models", b"GET /v1/models HTTP/1.1\r\nhost: x\r\nauthorization: Bearer %b\r\n\r\n" % USER_KEY.encode(),
          "GET", 200),
    Shape("head", b"HEAD /health HTTP/1.1\r\nhost: x\r\n\r\n", "HEAD", 200),
    Shape("chat", _post("/v1/chat/completions", {"model": MODEL, "max_tokens": 2,
                                                 "messages": [{"role": "user", "content": "hi"}]}), "POST", 200),
    Shape("stream", _post("/v1/completions", {**COMPLETION, "stream": True}), "POST", 200),
    Shape("pd", _post("/v1/completions", {**COMPLETION, "prompt": LONG + "fuzz"},
                      extra=b"x-slo-class: interactive\r\n"), "POST", 200),
    Shape("pd-stream", _post("/v1/completions", {**COMPLETION, "prompt": LONG + "fuzz", "stream": True}), "POST",
          200),
    Shape("expect", _post("/v1/completions", COMPLETION, extra=b"expect: 100-continue\r\n"), "POST", 200),
    Shape("chunked", _chunked("/v1/completions", json.dumps(COMPLETION).encode(), b"x-trailer: 1\r\n", USER_KEY),
          "POST", 200),
    Shape("trailer-auth", _chunked("/v1/completions", json.dumps(COMPLETION).encode(),
                                   b"authorization: Bearer %b\r\n" % USER_KEY.encode(), "wrong"), "POST", 401),
    Shape("no-key", _post("/v1/completions", COMPLETION, key=""), "POST", 401),
    Shape("bad-json", _post("/v1/completions", b'{"model": '), "POST", 400),
    Shape("deep-json", _post("/v1/completions", b'{"model": "%b", "prompt": "x", "m": %b%b}'
                             % (MODEL.encode(), b"[" * 400, b"]" * 400)), "POST", 400),
    Shape("no-route", b"GET /nope HTTP/1.1\r\nhost: x\r\n\r\n", "GET", 404),
    Shape("http10", b"GET /health HTTP/1.0\r\n\r\n", "GET", 200, closes=True),
    Shape("no-host", b"GET /health HTTP/1.1\r\n\r\n", "GET", 400, closes=True),
    Shape("dup-auth", b"GET /v1/models HTTP/1.1\r\nhost: x\r\nauthorization: Bearer a\r\nauthorization: Bearer b\r\n"
          b"\r\n", "GET", 400, closes=True),
    Shape("big-head", b"GET /health HTTP/1.1\r\nhost: x\r\n" + b"".join(b"x-h%d: v\r\n" % i for i in range(150))
          + b"\r\n", "GET", 431, closes=True),
    Shape("big-body", _post("/v1/completions", b"{" + b" " * (MAX_BODY_BYTES + 10) + b"}"), "POST", 413, closes=True),
    Shape("bad-chunk", b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
          "POST", 400, closes=True),
    Shape("gzip-te", b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
          "POST", 501, closes=True),
    Shape("upgrade", b"GET /health HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n", "GET",
          400, closes=True),
]


@dataclass
class Conn:
    sock: socket.socket
    sent: list[Shape] = field(default_factory=list)
    got: bytes = b""
    writable: bool = True
    dropped: bool = False

    def read_for(self, seconds: float, limit: int = 1 << 22) -> bool:
        """Read what arrives within `seconds`; False once the router has closed."""
        self.sock.settimeout(seconds)
        try:
            while len(self.got) < limit:
                part = self.sock.recv(65536)
                if not part:
                    return False
                self.got += part
        except (TimeoutError, BlockingIOError):
            return True
        return True


def check_responses(conn: Conn) -> None:
    """Every request answered once, in order, well-formed, with its status; nothing after a
    response that closes the connection."""
    data = conn.got
    for k, shape in enumerate(conn.sent):
        parser = h11.Connection(h11.CLIENT)
        parser.send(h11.Request(method=shape.method, target="/", headers=[("host", "x")]))
        if data:  # h11 reads empty data as the peer's EOF: nothing yet is not a close
            parser.receive_data(data)
        status, ended = 0, False
        while not ended:
            event = parser.next_event()
            assert event is not h11.NEED_DATA, (f"response {k} ({shape.name}) incomplete", data[:300])
            if isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.EndOfMessage):
                ended = True
            elif isinstance(event, h11.ConnectionClosed):
                raise AssertionError(f"closed before response {k} ({shape.name}) ended")
        assert status == shape.status, (k, shape.name, status, [s.name for s in conn.sent])
        data = parser.trailing_data[0]
        if shape.closes or parser.our_state is h11.MUST_CLOSE or parser.their_state is h11.MUST_CLOSE:
            assert data == b"", (shape.name, data[:200])  # nothing after a closing response
            return
    assert data == b"", data[:200]


class FrontDoor(RuleBasedStateMachine):
    conns = Bundle("conns")
    deployment: Deployment

    @initialize(target=conns)
    def first(self) -> Conn:
        self.all: list[Conn] = []
        return self._connect()

    @rule(target=conns)
    def open(self) -> Conn:
        return self._connect()

    def _connect(self) -> Conn:
        conn = Conn(socket.create_connection((self.deployment.host, self.deployment.port), timeout=5))
        self.all.append(conn)
        return conn

    @rule(conn=conns, shapes=st.lists(st.sampled_from(SHAPES), min_size=1, max_size=5),
          cuts=st.lists(st.integers(1, 400), max_size=4),
          then=st.sampled_from(["nothing", "read-some", "read-slowly", "half-close", "drop", "reset"]))
    def send(self, conn: Conn, shapes: list[Shape], cuts: list[int], then: str) -> None:
        """Pipeline requests in one write, or in pieces cut anywhere (mid-head, mid-chunk); then
        read nothing, part, slowly, half-close, or go away (FIN or RST)."""
        if conn.dropped:
            return
        if conn.writable and not any(s.closes for s in conn.sent):
            data = b"".join(s.raw for s in shapes)
            conn.sent.extend(shapes)
            try:
                for cut in cuts:
                    conn.sock.sendall(data[:cut])
                    data = data[cut:]
                    time.sleep(0.002)
                conn.sock.sendall(data)
            except OSError:  # the router closed after a refusal it may answer before reading all
                conn.writable = False
        if then == "read-some":
            conn.read_for(0.02, limit=len(conn.got) + 4096)
        elif then == "read-slowly":
            for _ in range(5):
                conn.read_for(0.01, limit=len(conn.got) + 512)
        elif then == "half-close" and conn.writable:
            # the router may have reset the connection already (it closes after an HTTP/1.0
            # answer with more pipelined behind it): nothing left to half-close then
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_WR)
            conn.writable = False
        elif then in ("drop", "reset"):
            if then == "reset":
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.sock.close()
            conn.dropped = True

    @invariant()
    def router_alive(self) -> None:
        assert self.deployment.proc.poll() is None

    def teardown(self) -> None:
        for conn in getattr(self, "all", []):
            if conn.dropped:
                continue
            deadline = time.monotonic() + 15
            while conn.read_for(0.2) and time.monotonic() < deadline:
                try:
                    check_responses(conn)
                    break
                except AssertionError:
                    continue  # not all in yet
            conn.sock.close()
            check_responses(conn)


@pytest.fixture(scope="module")
def baseline(deployment: Deployment) -> tuple[int, float]:
    time.sleep(0.5)
    return fds_held(deployment.proc.pid, engine_ports(deployment.engines))[0], rss_mib(deployment.proc.pid)


def test_stateful_fuzz_keeps_every_invariant(deployment: Deployment, baseline: tuple[int, float]) -> None:
    FrontDoor.deployment = deployment
    run_state_machine_as_test(FrontDoor, settings=settings(max_examples=40, stateful_step_count=10, deadline=None,
                                                           suppress_health_check=list(HealthCheck)))
    # everything the clients left behind is gone: engines, router state, descriptors, memory
    deadline = time.monotonic() + 10
    while True:
        engines = {n: engine_state(e) for n, e in deployment.engines.items()}
        _, _, raw = call(deployment.base + "/admin/replicas", key=ADMIN_KEY)
        replicas = json.loads(raw)["replicas"]
        fds, upstream = fds_held(deployment.proc.pid, engine_ports(deployment.engines))
        settled = (all(s == (0.0, 0.0) for s in engines.values()) and fds <= baseline[0] + 4
                   and sum(r["inflight"] for r in replicas) == 0)
        if settled or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert all(s == (0.0, 0.0) for s in engines.values()), engines  # nothing running, no KV held
    assert not any(r["breaker_open"] for r in replicas) and sum(r["inflight"] for r in replicas) == 0, replicas
    # no client connection or other descriptor left behind; the idle keep-alive connections to
    # the engines are bounded by what overlapped (at most a few per fuzz step here)
    assert fds <= baseline[0] + 4, (fds, upstream, baseline)
    assert upstream <= 64, upstream
    assert rss_mib(deployment.proc.pid) - baseline[1] < 64
