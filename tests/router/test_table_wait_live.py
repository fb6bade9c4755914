"""The table wait (`upstream.table_wait_s`) driven from outside, on the real router on loopback and
a real simulated engine: the router's view lists only a stopped engine (a scale-in or a move the
controller's next table has not reached it yet).

- The official openai SDK, in the request shapes the API allows (content as a string and as parts,
  n with logprobs, a stream, a list of prompts, tools, response_format), waits and is answered by
  the engine once the next table comes: no 503 "no healthy replica" in between.
- Clients that hang up during the wait leave nothing behind: no request in flight, none sent to
  the engine when the table comes, no connection of theirs left open in the router.
- A wait that brings nothing ends in an OpenAI-shaped 503 after the bound, not at once.

The hung-up clients also open the stopped engine's breaker; before it opens, their requests wait
too (every replica they were sent to refused the connection: no engine saw them), so none is
answered 502 (tests/router/test_table_wait.py)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import openai
import pytest

from pools.routing import ReplicaEndpoint, RoutingTable
from router.config import DEV_ADMIN_KEY, DEV_KEY, RouterConfig, sha256
from router.server import Router
from tests.support.clients import openai_client
from tests.support.engines import running_engine
from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration
MODEL = "llama-3.1-8b"
WAIT_S = 12.0
HANG_UPS = 24
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def _table(version: int, url: str, draining: bool = False) -> RoutingTable:
    return RoutingTable(version=version, epoch="controller-1", replicas=(ReplicaEndpoint(
        replica_id="mixed-0", url=url, model=MODEL, pool="mixed", role="mixed", draining=draining,
        slo_classes=("interactive", "standard")),))


def _router(view: RoutingTable) -> Router:
    config = RouterConfig.model_validate({
        "port": 0, "keys": [{"tenant": "t", "key_sha256": sha256(DEV_KEY)}],
        "admin_keys": [{"tenant": "ops", "key_sha256": sha256(DEV_ADMIN_KEY)}], "pd": {"enabled": False},
        "upstream": {"table_wait_s": WAIT_S}})
    return Router(config, view)


def _calls(client: openai.OpenAI) -> dict[str, Callable[[], Any]]:
    """Each request shape, and what of its answer says the engine answered it."""
    chat: Any = client.chat.completions  # the SDK's overloads want its own TypedDicts for messages
    hello = [{"role": "user", "content": "hello there"}]
    parts = [{"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": "again"}]}]

    def stream() -> str:
        chunks = chat.create(model=MODEL, max_tokens=6, messages=hello, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    def choices() -> list[tuple[str, bool]]:
        got = chat.create(model=MODEL, max_tokens=3, messages=parts, n=2, logprobs=True, top_logprobs=2)
        return [(c.message.content, c.logprobs is not None) for c in got.choices]

    return {
        "string": lambda: chat.create(model=MODEL, max_tokens=4, messages=hello).choices[0].message.content,
        "parts, n=2, logprobs": choices,
        "stream": stream,
        "list of prompts": lambda: [c.text for c in client.completions.create(
            model=MODEL, prompt=["one", "two"], max_tokens=3).choices],
        "tools": lambda: chat.create(model=MODEL, max_tokens=16, messages=hello, tools=[WEATHER]).choices[0].message,
        "response_format": lambda: chat.create(model=MODEL, max_tokens=16, messages=hello,
                                               response_format={"type": "json_object"}).choices[0].message.content,
    }


def _accepted(port: int) -> int:
    """This process's open sockets whose local port is `port`, the listener apart: the router's
    side of its clients' connections (/proc/self/fd's socket inodes in /proc/self/net/tcp)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    with open("/proc/self/net/tcp") as table:
        rows = [line.split() for line in table.readlines()[1:]]
    # columns: sl local remote state ... inode (10th); state 0A is LISTEN
    return sum(1 for row in rows if int(row[1].split(":")[1], 16) == port and row[3] != "0A" and row[9] in inodes)


def _engine_requests(base: str) -> float:
    with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total{"))


async def _hang_up(port: int) -> None:
    """A whole request, then the client goes away while it waits for a table."""
    body = json.dumps({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "bye"}]}).encode()
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 b"authorization: Bearer " + DEV_KEY.encode() + b"\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body))
    await writer.drain()
    await asyncio.sleep(0.3)
    writer.close()
    await writer.wait_closed()


def _inflight(r: Router) -> int:
    return sum(r.metrics.inflight.values())


def test_clients_waiting_for_the_next_table() -> None:
    asyncio.run(_waiting_clients())


async def _waiting_clients() -> None:
    with running_engine("--model", MODEL, "--gpu", "h100-sxm", "--time-scale", "0.01", "--tool-call-parser",
                        "hermes", "--enable-auto-tool-choice") as engine:
        stopped = socket.socket()  # a bound port that listens to nothing: connections are refused
        stopped.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{stopped.getsockname()[1]}"
        view = _table(1, dead)
        r = _router(view)
        await r.start()
        try:
            client = openai_client(f"http://127.0.0.1:{r.port}/v1", DEV_KEY)
            before_engine = _engine_requests(engine.base)

            # clients that hang up while they wait: nothing of them is left, none reaches the engine
            await asyncio.gather(*(_hang_up(r.port) for _ in range(HANG_UPS)))
            await wait_until_async(lambda: _inflight(r) == 0 and _accepted(r.port) == 0, WAIT_S / 2,
                                   "the hung-up requests ended, and their connections, well before the wait's end")

            # every SDK shape waits, then the engine answers it on the next table
            calls = _calls(client)
            tasks = {name: asyncio.create_task(asyncio.to_thread(call)) for name, call in calls.items()}
            await wait_until_async(lambda: _inflight(r) == len(calls), 20, "every request waits for a table")
            await asyncio.sleep(0.5)
            assert not [name for name, t in tasks.items() if t.done()]  # no early 503
            await r.set_view(_table(2, engine.base), None, None)
            answers = {name: await asyncio.wait_for(t, 60) for name, t in tasks.items()}
            assert answers["string"] and answers["stream"] and answers["response_format"]
            assert len(answers["parts, n=2, logprobs"]) == 2 and all(lp for _, lp in answers["parts, n=2, logprobs"])
            assert len(answers["list of prompts"]) == 2
            assert answers["tools"].content or answers["tools"].tool_calls
            # the engine counts a sequence per choice: 1 + 2 (n=2) + 1 + 2 (two prompts) + 1 + 1
            served = _engine_requests(engine.base) - before_engine
            assert served == 8, f"the engine finished {served} sequences; the SDK asked for 8"

            # a wait that brings nothing (the only replica drains, its replacement never comes): 503
            # in the OpenAI error shape, after the bound
            await r.set_view(_table(3, engine.base, draining=True), None, None)
            started = time.monotonic()
            with pytest.raises(openai.APIStatusError) as refused:
                await asyncio.to_thread(lambda: client.chat.completions.create(
                    model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "anyone?"}]))
            waited = time.monotonic() - started
            assert refused.value.status_code == 503 and waited >= WAIT_S - 0.5, (refused.value.status_code, waited)
            assert isinstance(refused.value.body, dict) and refused.value.body.get("message"), refused.value.body
            client.close()
            await wait_until_async(lambda: _inflight(r) == 0 and _accepted(r.port) == 0, 10,
                                   "no request in flight and no client connection left open in the router")
        finally:
            await r.stop()
            stopped.close()
