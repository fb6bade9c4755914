"""The controller's side of prefix-cache routing: with the router's `kv_events` endpoint in its
spec, each replica's engine is started with prefix caching on and publishing its cache's events
there under its replica id, and the routing table says it publishes. Driven for real: the
replica's own start (`control.replicas.sim.ReplicaProcess`, the engine from the launch's argv),
the router's index following the controller's table, and two chats sharing a system prompt."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest

from control.launch.build import build_launch
from control.nodecheck import RayNode
from control.replicas.sim import ReplicaProcess
from control.table import build_table
from pools.model import PlacementRequest, PoolSpec
from pools.placement import get_policy
from router.kvindex import KvIndex
from tests.control.conftest import PAIRS
from tests.support.ports import free_ports
from tests.support.wait import wait_until_async
from topology import read_source
from wire.prompt import chat_prompt

pytestmark = pytest.mark.integration

SYSTEM = "You answer questions about the harbour's ferry timetable, briefly. " * 30
POOL = PoolSpec(name="chat", role="mixed", tp=1, replicas=2, model="llama-3.1-8b")


def _chat(url: str, question: str) -> None:
    body = {"model": "llama-3.1-8b", "max_tokens": 2,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        resp.read()


def test_the_controllers_engines_publish_their_caches_to_the_router() -> None:
    (port,) = free_ports(1)
    endpoint = f"tcp://127.0.0.1:{port}"
    topology = read_source(PAIRS)
    plan = get_policy("island-aligned").place(PlacementRequest(topology=topology, pools=(POOL,)))
    first = plan.placements[0]
    launch = build_launch(plan, topology, {}, first, 0, topology_source=PAIRS, time_scale=1.0,
                          kv_events_endpoint=endpoint, kv_block_size=16)
    argv = launch.command()
    assert argv[argv.index("--block-size") + 1] == "16" and "--enable-prefix-caching" in argv
    assert json.loads(argv[argv.index("--kv-events-config") + 1])["topic"] == first.replica_id
    quiet = build_launch(plan, topology, {}, first, 0, topology_source=PAIRS, time_scale=1.0)
    assert "--kv-events-config" not in quiet.command()  # without the router's endpoint: nothing published
    remote = {first.node: RayNode(node_id="n1", address="10.0.0.7")}  # another host: it could not reach loopback
    far = build_launch(plan, topology, remote, first, 0, topology_source=PAIRS, time_scale=1.0,
                       kv_events_endpoint=endpoint, kv_block_size=16)
    assert not far.kv_events and "--kv-events-config" not in far.command()

    async def main() -> tuple[int, int]:
        index = KvIndex(endpoint, 16)  # the router's subscriber, bound before the engine connects
        index.start()
        replica = ReplicaProcess(launch)
        try:
            url = await asyncio.to_thread(replica.start)
            table = build_table(plan, topology, {first.replica_id: url}, (), 1, publishing={first.replica_id})
            assert [(r.replica_id, r.publishes) for r in table.replicas] == [(first.replica_id, True)]
            index.follow(table.replicas)
            await asyncio.to_thread(_chat, url, "When does the first ferry leave?")
            blocks = await wait_until_async(lambda: index.index.blocks(first.replica_id) or None, 10.0,
                                            "the engine's first blocks in the router's index")
            body = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "And back?"}]}
            view = index.held(index.local(chat_prompt(body["messages"]).key), [first.replica_id])
            cacheable, held = view.cacheable_tokens, view.held
            assert held.get(first.replica_id, 0) >= len(SYSTEM) // 4 - 32  # the system prompt, but its last blocks
            return blocks, cacheable
        finally:
            await asyncio.to_thread(replica.stop)
            await index.stop()

    blocks, cacheable = asyncio.run(main())
    assert blocks > 0 and cacheable > 0
