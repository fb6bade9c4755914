"""Upstream deadlines on the router's callback path: a replica that never answers is left for the
next one after the first-byte deadline; a stream that goes quiet mid-way ends with an error
event after the idle deadline; a client too slow to read is the client's fault, never the
replica's. Real router, real loopback sockets, tiny hand-written upstreams."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable

import pytest

from router.cli import table_from_config
from router.config import DEV_KEY, RouterConfig, sha256
from router.server import Router
from tests.support.stubhttp import read_request

pytestmark = [pytest.mark.integration, pytest.mark.serial]
Upstream = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
STOP: list[asyncio.Event] = []
"""Set when a test ends: the upstreams that hang stop hanging."""
OK = b'{"id":"x","object":"text_completion","choices":[{"index":0,"text":"hi","finish_reason":"stop"}]}'


async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    try:
        await STOP[0].wait()  # never answers
    finally:
        writer.close()


def answering(body: bytes) -> Upstream:
    """An upstream that answers every request on the connection with this JSON body."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                await read_request(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%b"
                         % (len(body), body))
            await writer.drain()
        writer.close()

    return serve


good = answering(OK)


async def quiet_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    chunk = b'data: {"choices":[{"index":0,"text":"a"}]}\n\n'
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                 + b"%x\r\n%b\r\n" % (len(chunk), chunk))
    await writer.drain()
    try:
        await STOP[0].wait()  # goes quiet mid-stream
    finally:
        writer.close()


async def _router(upstreams: dict[str, Upstream], clock: Callable[[], float] = time.perf_counter, **extra: object
                  ) -> tuple[Router, list[asyncio.Server]]:
    STOP[:] = [asyncio.Event()]
    servers = {name: await asyncio.start_server(fn, "127.0.0.1", 0) for name, fn in upstreams.items()}
    config = RouterConfig.model_validate({
        "port": 0, "keys": [{"tenant": "t", "key_sha256": sha256(DEV_KEY)}],
        "admin_keys": [{"tenant": "ops", "key_sha256": sha256("admin")}],
        "default_profile": {"picker": "round-robin-picker"},
        "upstream": {"first_byte_timeout_s": 0.4, "request_timeout_s": 0.4, "idle_timeout_s": 0.4, "retries": 1},
        "replicas": [{"replica_id": name, "url": f"http://127.0.0.1:{s.sockets[0].getsockname()[1]}", "model": "m"}
                     for name, s in servers.items()], **extra})
    router = Router(config, table_from_config(config), clock=clock)
    await router.start()
    return router, list(servers.values())


async def _post(port: int, body: dict[str, object]) -> tuple[bytes, float]:
    raw = json.dumps(body).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    t0 = time.monotonic()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer %b\r\n"
                 b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%b"
                 % (DEV_KEY.encode(), len(raw), raw))
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    await writer.wait_closed()
    return data, time.monotonic() - t0


async def _stop(router: Router, servers: list[asyncio.Server]) -> None:
    await router.stop()
    STOP[0].set()
    for s in servers:
        s.close()
    await asyncio.sleep(0.1)  # the hanging handlers return, closed transports finish closing


def test_a_replica_that_never_answers_is_left_for_the_next_after_the_deadline() -> None:
    async def main() -> None:
        router, servers = await _router({"a-silent": silent, "b-good": good})
        try:
            for _ in range(2):  # round robin: one of the two starts on the silent replica
                data, took = await _post(router.port, {"model": "m", "prompt": "x", "max_tokens": 1})
                assert data.startswith(b"HTTP/1.1 200") and b"x-isle-replica: b-good" in data, data
                assert took < 5
        finally:
            await _stop(router, servers)

    asyncio.run(main())


def test_deadlines_and_latencies_follow_the_clock_the_router_is_given() -> None:
    """The request path reads time only from the router's clock: on one that runs ten times
    fast, a 3 s first-byte deadline passes in about 0.3 s of wall time, and the latency the
    router records is ten times what the wall clock saw."""
    def fast() -> float:
        return 10 * time.perf_counter()

    async def main() -> None:
        router, servers = await _router({"a-silent": silent, "b-good": good}, clock=fast,
                                        upstream={"first_byte_timeout_s": 3.0, "request_timeout_s": 3.0,
                                                  "idle_timeout_s": 3.0, "retries": 1})
        try:
            for _ in range(2):  # round robin: one of the two starts on the silent replica
                data, took = await _post(router.port, {"model": "m", "prompt": "x", "max_tokens": 1})
                assert data.startswith(b"HTTP/1.1 200") and b"x-isle-replica: b-good" in data, data
                assert took < 2.0  # not the 3 s a wall-clock deadline would take
            text = router.metrics.render().decode()
            e2e = {line.split("{")[0]: float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith(("isle_router_e2e_seconds_sum", "isle_router_e2e_seconds_count"))
                   and 'slo_class="interactive"' in line}
            assert e2e["isle_router_e2e_seconds_count"] == 2
            assert e2e["isle_router_e2e_seconds_sum"] > 2.0  # the silent replica's 3 s, on the fast clock
        finally:
            await _stop(router, servers)

    asyncio.run(main())


def test_a_stream_that_goes_quiet_ends_with_an_error_event() -> None:
    async def main() -> None:
        router, servers = await _router({"quiet": quiet_stream})
        try:
            data, took = await _post(router.port, {"model": "m", "prompt": "x", "max_tokens": 9, "stream": True})
            assert b'"text":"a"' in data  # the token that came is delivered once
            assert b"upstream replica failed mid-stream" in data and data.endswith(b"0\r\n\r\n")
            assert took < 5
            text = router.metrics.render().decode()
            assert 'isle_router_requests_total{outcome="error",slo_class="interactive"} 1.0' in text
        finally:
            await _stop(router, servers)

    asyncio.run(main())


prefill = answering(  # a prefill replica: max_tokens=1 answered with kv_transfer_params for the decode side
    b'{"id":"p","choices":[{"index":0,"text":"x"}],"kv_transfer_params":{"remote_engine_id":"p",'
    b'"remote_request_id":"r1","remote_block_ids":[0],"do_remote_prefill":true}}')


def test_a_pd_only_deployment_splits_short_prompts_too() -> None:
    async def main() -> None:
        STOP[:] = [asyncio.Event()]
        servers = {name: await asyncio.start_server(fn, "127.0.0.1", 0) for name, fn in
                   (("p1", prefill), ("d1", good))}
        config = RouterConfig.model_validate({
            "port": 0, "keys": [{"tenant": "t", "key_sha256": sha256(DEV_KEY)}],
            "admin_keys": [{"tenant": "ops", "key_sha256": sha256("admin")}],
            "pd": {"enabled": True, "min_prompt_tokens": 1000},
            "replicas": [{"replica_id": name, "url": f"http://127.0.0.1:{s.sockets[0].getsockname()[1]}",
                          "model": "m", "role": "prefill" if name == "p1" else "decode"}
                         for name, s in servers.items()]})
        router = Router(config, table_from_config(config))
        await router.start()
        try:
            data, _ = await _post(router.port, {"model": "m", "prompt": "short", "max_tokens": 3})
            assert data.startswith(b"HTTP/1.1 200"), data  # no mixed pool: a short prompt is disaggregated too
            assert b"x-isle-prefill-replica: p1" in data and b"x-isle-replica: d1" in data
        finally:
            await _stop(router, list(servers.values()))

    asyncio.run(main())


ABORTED: list[str] = []


async def flooding(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A fast, healthy replica: streams as fast as it is read, answers the rest at once."""
    while True:
        try:
            _, body = await read_request(reader)
        except (asyncio.IncompleteReadError, ConnectionError):
            break
        if b'"stream":true' not in body.replace(b" ", b""):
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%b"
                         % (len(OK), OK))
            await writer.drain()
            continue
        chunk = b'data: {"choices":[{"index":0,"text":"' + b"w" * 1000 + b'"}]}\n\n'
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        try:
            while True:
                writer.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
                await writer.drain()
        except ConnectionError:
            ABORTED.append("stream")
            break
    writer.close()


def test_slow_readers_never_change_a_replicas_health() -> None:
    """Three streams whose clients never read: the router holds the replica back for them (so the
    replica's stream goes quiet as the router sees it, far past the idle deadline), then drops
    those clients after client_write_timeout_s and aborts their engine requests. The replica's
    breaker (one failure opens it here) stays closed and it keeps serving everyone else."""
    import socket

    async def main() -> None:
        ABORTED.clear()
        router, servers = await _router({"r": flooding}, client_write_timeout_s=1.2, client_buffer_bytes=4096,
                                         upstream={"first_byte_timeout_s": 2, "request_timeout_s": 2,
                                                   "idle_timeout_s": 0.3, "breaker_failures": 1})
        raw = json.dumps({"model": "m", "prompt": "x", "max_tokens": 9999, "stream": True}).encode()
        slow = []
        try:
            for _ in range(3):
                sock = socket.create_connection(("127.0.0.1", router.port))
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer %b\r\n"
                             b"content-length: %d\r\n\r\n%b" % (DEV_KEY.encode(), len(raw), raw))
                slow.append(sock)
            await asyncio.sleep(0.9)  # held back far longer than the idle deadline
            data, _ = await _post(router.port, {"model": "m", "prompt": "x", "max_tokens": 1})
            assert data.startswith(b"HTTP/1.1 200"), data
            await asyncio.sleep(1.3)  # past the client write timeout
            state = router.replicas.states["r"]
            assert state.open_until < time.monotonic() and state.inflight == 0
            assert ABORTED == ["stream"] * 3  # the engine's work for them stopped
            text = router.metrics.render().decode()
            assert 'isle_router_requests_total{outcome="client_timeout",slo_class="interactive"} 3.0' in text
            assert "outcome=\"error\"" not in text
            data, _ = await _post(router.port, {"model": "m", "prompt": "x", "max_tokens": 1})
            assert data.startswith(b"HTTP/1.1 200"), data
        finally:
            for sock in slow:
                sock.close()
            await _stop(router, servers)

    asyncio.run(main())


async def queued_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """An engine whose queue is full: the stream's head goes out at once, the first token never."""
    await read_request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    await writer.drain()
    try:
        await STOP[0].wait()
    finally:
        writer.close()


async def streaming(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    for event in (b'data: {"choices":[{"index":0,"text":"a"}]}\n\n', b'data: {"choices":[{"index":0,"text":"b"}]}'
                  b'\n\n', b"data: [DONE]\n\n"):
        writer.write(b"%x\r\n%b\r\n" % (len(event), event))
    writer.write(b"0\r\n\r\n")
    await writer.drain()
    writer.close()


def test_first_byte_timeout_bounds_the_time_to_the_first_token_not_to_the_head() -> None:
    """An engine answers a stream's head before the request leaves its queue: the head is not the
    first token. Past first_byte_timeout_s without a token the request goes to the next replica
    (nothing reached the client yet), long before the idle timeout."""
    async def main() -> None:
        router, servers = await _router({"a-queued": queued_stream, "b-streaming": streaming},
                                        upstream={"first_byte_timeout_s": 0.4, "request_timeout_s": 5,
                                                  "idle_timeout_s": 5, "retries": 1})
        try:
            for _ in range(2):  # round robin: one of the two starts on the queued replica
                data, took = await _post(router.port, {"model": "m", "prompt": "x", "max_tokens": 2, "stream": True})
                assert data.startswith(b"HTTP/1.1 200") and b"x-isle-replica: b-streaming" in data, data
                assert b'"text":"a"' in data and b"[DONE]" in data
                assert took < 3  # the first-token deadline, not the 5 s idle one
        finally:
            await _stop(router, servers)

    asyncio.run(main())


def test_stop_leaves_no_task_of_the_router_running() -> None:
    """Its scrapes and LoRA refresh end inside `stop` (a task merely cancelled would run on
    against closed clients, and asyncio would warn it was destroyed pending)."""
    async def main() -> None:
        config = RouterConfig.model_validate({
            "port": 0, "keys": [{"tenant": "t", "key_sha256": sha256(DEV_KEY)}],
            "admin_keys": [{"tenant": "ops", "key_sha256": sha256("admin")}],
            "lora": {"adapters": [{"name": "sql", "base_model": "m", "path": "/adapters/sql"}], "refresh_s": 0.05},
            "replicas": [{"replica_id": "r1", "url": "http://127.0.0.1:9", "model": "m", "role": "mixed"}]})
        router = Router(config, table_from_config(config))
        await router.start()
        await asyncio.sleep(0.2)
        before = asyncio.all_tasks() - {asyncio.current_task()}
        assert before
        await router.stop()
        assert [t for t in before if not t.done()] == []

    asyncio.run(main())


def test_stop_closes_every_connection_to_the_engines_a_request_on_its_way_included() -> None:
    """A request still waiting for its engine when the router stops: the router closes that
    connection (an engine, vLLM among them, aborts a request whose connection closed) and its
    /metrics scrapers' too, inside `stop`, rather than leaving them open until the process
    exits; the request's client is answered with the error, not left waiting."""
    async def main() -> None:
        got: dict[int, bytes] = {}
        ended: set[int] = set()

        async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            """Reads whatever comes and never answers, until the router closes the connection."""
            me = len(got)
            got[me] = b""
            try:
                while chunk := await reader.read(65536):
                    got[me] += chunk
            except ConnectionError:
                pass
            finally:
                ended.add(me)
                writer.close()

        router, servers = await _router({"e": engine}, upstream={"first_byte_timeout_s": 60, "request_timeout_s": 60,
                                                                 "idle_timeout_s": 60, "retries": 0})
        raw = json.dumps({"model": "m", "prompt": "x", "max_tokens": 4}).encode()
        answer, client = await asyncio.open_connection("127.0.0.1", router.port)
        client.write(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer %b\r\n"
                     b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%b"
                     % (DEV_KEY.encode(), len(raw), raw))
        try:
            for _ in range(100):
                if any(data.startswith(b"POST /v1/completions") for data in got.values()):
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError(f"the request never reached the engine: {got}")
            await router.stop()
            for _ in range(40):
                if ended == set(got):
                    break
                await asyncio.sleep(0.05)
            assert ended == set(got), f"still open after stop: {sorted(set(got) - ended)} of {len(got)}"
            head = await asyncio.wait_for(answer.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith((b"HTTP/1.1 502", b"HTTP/1.1 503")), head  # answered, not left waiting
        finally:
            client.close()
            STOP[0].set()
            for s in servers:
                s.close()
            await asyncio.sleep(0.1)

    asyncio.run(main())
