"""A request that arrives while the router's view is behind the cluster: a scale-in stopped the
engines the view still lists and the replica left is only in the controller's next table (or a
moved replica's replacement is). The router does not answer 503 "no healthy replica" then: the
request waits for the next table the router follows and is served on it. A static table (no
controller) answers at once, as before; a wait that brings nothing ends with what the engines
said. A mixed replica whose engine refuses the connection is the same case (no engine saw the
request), before its breaker opens as after. The engines are tiny servers on loopback; a stopped
one is a port that refuses."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace

import pytest

from pools.model import Role
from pools.routing import ReplicaEndpoint, RoutingTable
from router.config import DEV_ADMIN_KEY, DEV_KEY, RouterConfig, sha256
from router.server import Router
from tests.support.stubhttp import read_request
from wire.reader import Request
from wire.responder import Responder

pytestmark = pytest.mark.integration
MODEL = "m"
KV: dict[str, object] = {"do_remote_prefill": True, "remote_engine_id": "p", "remote_host": "127.0.0.1",
                         "remote_port": 1, "remote_request_id": "r-1", "remote_block_ids": [0]}
ANSWER: dict[str, object] = {
    "id": "chatcmpl-1", "object": "chat.completion", "model": MODEL, "usage": {"completion_tokens": 4},
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "more"}, "finish_reason": "length"}]}


@dataclass
class Engine:
    """An engine's answers: the prefill leg's (with the KV it holds), or the decode leg's."""

    role: Role
    bodies: list[dict[str, object]] = field(default_factory=list)

    def answer(self, body: dict[str, object]) -> dict[str, object]:
        self.bodies.append(body)
        if self.role == "mixed":
            return ANSWER
        if self.role == "prefill":
            return {**ANSWER, "kv_transfer_params": KV}
        assert body["kv_transfer_params"] == KV  # what the prefill returned
        return ANSWER

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """POSTs answered by role; anything else (the router's /metrics scrape) 404, no body."""
        try:
            while True:
                try:
                    head, request = await read_request(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    break
                if not head.startswith(b"POST "):
                    writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                    continue
                body = json.dumps(self.answer(json.loads(request))).encode()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%b"
                             % (len(body), body))
                await writer.drain()
        finally:
            writer.close()


@asynccontextmanager
async def engines() -> AsyncIterator[tuple[dict[str, str], dict[str, Engine]]]:
    """URLs of a prefill engine, a decode engine (the replica left) and a stopped engine (a bound
    port that listens to nothing: connections are refused), and the two that answer."""
    live = {"prefill": Engine("prefill"), "left": Engine("decode")}
    servers = {name: await asyncio.start_server(e.serve, "127.0.0.1", 0) for name, e in live.items()}
    stopped = socket.socket()
    stopped.bind(("127.0.0.1", 0))
    urls = {name: f"http://127.0.0.1:{s.sockets[0].getsockname()[1]}" for name, s in servers.items()}
    urls["stopped"] = f"http://127.0.0.1:{stopped.getsockname()[1]}"
    try:
        yield urls, live
    finally:
        stopped.close()
        for s in servers.values():
            s.close()
            await s.wait_closed()
        await asyncio.sleep(0.05)  # the engines' side of the closed connections finishes closing


class Client:
    """The connection a response is written to: what was sent, and when it was."""

    def __init__(self) -> None:
        self.data = b""
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closed = self.paused = self.timed_out = False

    def write(self, data: bytes) -> None:
        self.data += data

    async def drain(self) -> None:
        pass

    def response_done(self, keep_alive: bool) -> None:
        self.done.set_result(None)

    def when_resumed(self, callback: Callable[[], None]) -> None:
        pass

    def when_gone(self, callback: Callable[[], None]) -> None:
        pass

    def status(self) -> int:
        return int(self.data.split(b" ", 2)[1])

    def header(self, name: str) -> str | None:
        head = self.data.split(b"\r\n\r\n", 1)[0].decode().lower()
        return next((line.split(": ", 1)[1] for line in head.split("\r\n")[1:] if line.startswith(name + ":")), None)


def endpoint(rid: str, url: str, role: Role, draining: bool = False) -> ReplicaEndpoint:
    return ReplicaEndpoint(replica_id=rid, url=url, model=MODEL, pool=role, role=role, draining=draining,
                           slo_classes=("interactive", "standard"))


def router(table: RoutingTable, **upstream: object) -> Router:
    config = RouterConfig.model_validate({
        "port": 0, "keys": [{"tenant": "t", "key_sha256": sha256(DEV_KEY)}],
        "admin_keys": [{"tenant": "ops", "key_sha256": sha256(DEV_ADMIN_KEY)}], "upstream": upstream})
    return Router(config, table)


async def ask(r: Router) -> Client:
    body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "request 1: tell me more"}]}
    request = Request(method="POST", path="/v1/chat/completions", query={}, peer="127.0.0.1:1", body=json.dumps(
        body).encode(), headers={"authorization": f"Bearer {DEV_KEY}", "x-slo-class": "standard"})
    client = Client()
    try:
        work = r.handle(request, Responder(client, keep_alive=True))
        if work is not None:
            await work
        await asyncio.wait_for(client.done, 10)
    finally:
        await r.stop()  # its connections to the engines close; a KV release still out is let go
    return client


async def with_follower(r: Router, table: RoutingTable) -> Client:
    """The request, and the router's follower: it takes the controller's next table (`table`)
    once a request waits for one."""
    async def follow() -> None:
        while not r.replicas.awaiting:
            await asyncio.sleep(0)
        await r.set_view(table, None, None)

    follower = asyncio.get_running_loop().create_task(follow())
    try:
        return await ask(r)
    finally:
        follower.cancel()


def tables(urls: dict[str, str], *, moving: bool = False) -> tuple[RoutingTable, RoutingTable]:
    """The router's view and the controller's next table. A scale-in: the view lists decode-0,
    whose engine the scale-in has just stopped, not decode-2, the replica left. A move
    (`moving`): the only decode drains, its replacement (another port) is in the next table."""
    pre = endpoint("prefill-0", urls["prefill"], "prefill")
    view = RoutingTable(version=4, epoch="controller-1", replicas=(
        pre, endpoint("decode-0", urls["stopped"], "decode", draining=moving)))
    left = endpoint("decode-0" if moving else "decode-2", urls["left"], "decode")
    return view, replace(view, version=5, replicas=(pre, left))


def test_a_request_after_a_scale_in_is_served_by_the_replica_left() -> None:
    async def main() -> None:
        async with engines() as (urls, live):
            view, after = tables(urls)
            client = await with_follower(router(view), after)
            assert client.status() == 200, client.data
            assert (client.header("x-isle-replica"), client.header("x-isle-prefill-replica")) == ("decode-2",
                                                                                               "prefill-0")
            legs = [b.get("max_tokens", "release") for b in live["prefill"].bodies]
            assert sorted(map(str, legs)) == ["1", "1", "release"]  # the first prefill's KV is let go, not held
            assert len(live["left"].bodies) == 1

    asyncio.run(main())


def test_a_moved_replica_serves_once_its_replacement_is_in_the_table() -> None:
    """No usable decode in the view (the one it has drains): the request waits for the table
    with the replacement instead of a 503."""
    async def main() -> None:
        async with engines() as (urls, live):
            view, after = tables(urls, moving=True)
            client = await with_follower(router(view), after)
            assert client.status() == 200 and client.header("x-isle-replica") == "decode-0", client.data
            assert len(live["left"].bodies) == 1

    asyncio.run(main())


def test_a_static_table_answers_at_once_and_a_fruitless_wait_says_what_failed() -> None:
    async def main() -> None:
        async with engines() as (urls, _live):
            stopped = urls["stopped"].removeprefix("http://").encode()
            scaled, moving = tables(urls)[0], tables(urls, moving=True)[0]
            for view in (scaled, moving):  # no controller: no newer table comes, nothing to wait for
                client = await asyncio.wait_for(ask(router(replace(view, epoch=""), table_wait_s=60)), 5)
                if view is moving:
                    assert client.status() == 503 and b"no healthy replica" in client.data, client.data
                else:  # what the stopped engine did, not "no healthy replica"
                    assert client.status() == 502 and b"cannot connect to " + stopped in client.data, client.data
            waited = await ask(router(scaled, table_wait_s=0.05))  # under a controller, no newer table within it
            assert waited.status() == 502 and b"cannot connect to " + stopped in waited.data, waited.data

    asyncio.run(main())


def test_a_mixed_replica_whose_engine_was_stopped_is_not_a_502() -> None:
    """The view lists one mixed replica, whose engine a scale-in has just stopped (its port refuses),
    and its breaker is closed: the request is not answered 502 "cannot connect" but waits for the
    next table and is served by the replica left. Without a controller (a static table) it is the
    502 at once, as before; under one, a wait that brings nothing ends in that 502, not sooner."""
    async def main() -> None:
        async with engines() as (urls, live):
            stopped = urls["stopped"].removeprefix("http://").encode()
            gone = endpoint("mixed-0", urls["stopped"], "mixed")
            view = RoutingTable(version=4, epoch="controller-1", replicas=(gone,))
            after = replace(view, version=5, replicas=(endpoint("mixed-2", urls["left"], "mixed"),))
            live["left"].role = "mixed"
            r = router(view, table_wait_s=30)
            assert not r.replicas.snapshot()[0].load.breaker_open
            client = await asyncio.wait_for(with_follower(r, after), 20)
            assert client.status() == 200 and client.header("x-isle-replica") == "mixed-2", client.data
            assert len(live["left"].bodies) == 1

            static = await asyncio.wait_for(ask(router(replace(view, epoch=""), table_wait_s=30)), 5)
            assert static.status() == 502 and b"cannot connect to " + stopped in static.data, static.data
            loop = asyncio.get_running_loop()
            began = loop.time()
            waited = await asyncio.wait_for(ask(router(view, table_wait_s=0.5)), 10)
            assert waited.status() == 502 and b"cannot connect to " + stopped in waited.data, waited.data
            assert loop.time() - began >= 0.5

    asyncio.run(main())


def test_many_requests_refused_at_connect_leave_nothing_behind() -> None:
    """200 requests at once to a view whose only replica's engine refuses connections, under a
    controller whose next table never comes: each waits the bound and is answered 502, "cannot
    connect" (its breaker opens after the first failures, and a 503 "no healthy replica" would hide
    why); nothing is left in flight, no admission slot held, no task of the router's running."""
    async def main() -> None:
        async with engines() as (urls, _live):
            stopped = urls["stopped"].removeprefix("http://").encode()
            view = RoutingTable(version=4, epoch="controller-1",
                                replicas=(endpoint("mixed-0", urls["stopped"], "mixed"),))
            r = router(view, table_wait_s=0.5)
            body = json.dumps({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
            clients = []
            loop = asyncio.get_running_loop()
            began = loop.time()
            try:
                works = []
                for _ in range(200):
                    client = Client()
                    clients.append(client)
                    request = Request(method="POST", path="/v1/chat/completions", query={}, peer="127.0.0.1:1",
                                      body=body.encode(), headers={"authorization": f"Bearer {DEV_KEY}"})
                    work = r.handle(request, Responder(client, keep_alive=True))
                    if work is not None:
                        works.append(asyncio.ensure_future(work))
                await asyncio.wait_for(asyncio.gather(*works, *(c.done for c in clients)), 20)
                waited = loop.time() - began
                assert {c.status() for c in clients} == {502}
                assert all(b"cannot connect to " + stopped in c.data for c in clients)
                assert waited >= 0.5
                await asyncio.sleep(0.05)
                assert sum(r.admission.inflight.values()) == 0
                assert not r.generation.background, r.generation.background
            finally:
                await r.stop()

    asyncio.run(main())
