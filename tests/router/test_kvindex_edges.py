"""The router's KV index where an engine's blocks are not a plain prompt's: blocks vLLM salted
(`extra_keys`), a request with a `cache_salt`, an engine with another block size, a replica that
does not publish. In each case the index must not predict hits the engine will not have."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest

from kvblocks.events import BlockStored, EventBatch
from kvblocks.index import BlockIndex
from pools.routing import ReplicaEndpoint
from router.kvindex import CacheView, KvIndex
from tests.support.ports import free_ports
from wire.kvevents import decode, encode
from wire.prompt import chat_prompt
from wire.text import piece_ids

pytestmark = pytest.mark.unit

MODEL = "m"
MESSAGES = [{"role": "user", "content": "Tell me about the tide tables of the northern harbour, please. " * 4}]


def _stored(tokens: list[int], block: int = 16, extra: tuple[object, ...] | None = None, first: int = 1
            ) -> BlockStored:
    n = len(tokens) // block
    return BlockStored(tuple(range(first, first + n)), None, tuple(tokens[:n * block]), block, extra_keys=extra)


def _endpoint(publishes: bool = True) -> ReplicaEndpoint:
    return ReplicaEndpoint(replica_id="e0", url="http://127.0.0.1:1", model=MODEL, pool="p", role="mixed",
                           kv_events=publishes)


def _view(index: KvIndex, body: Mapping[str, object], publishes: bool = True) -> CacheView:
    view = index.request(MODEL, body, "/v1/chat/completions", chat_prompt(MESSAGES).key, [_endpoint(publishes)])
    assert isinstance(view, CacheView)  # simulated replicas: keyed here, no round trip
    return view


def _index() -> KvIndex:
    return KvIndex(f"tcp://127.0.0.1:{free_ports(1)[0]}", 16)


def test_salted_blocks_survive_the_wire_and_never_match_a_plain_prompt() -> None:
    tokens = piece_ids(chat_prompt(MESSAGES).key)
    n = len(tokens) // 16
    salted = _stored(tokens, extra=(("tenant-a",),) + (None,) * (n - 1))
    again = decode(encode(EventBatch(1.0, (salted,))))
    assert again.events[0] == salted  # vLLM's extra_keys field, both ways
    index = _index()
    index._take("e0", again)
    body = {"model": MODEL, "messages": MESSAGES}
    assert index.index.blocks("e0") == n and _view(index, body).held == {}  # held, but not for this prompt
    index._take("e0", EventBatch(2.0, (_stored(tokens, first=1000),)))  # vLLM's hashes differ without the salt
    assert _view(index, body).held["e0"] > 0  # the plain prompt's own blocks match
    assert _view(index, {**body, "cache_salt": "tenant-a"}) == CacheView()  # a salted request: not keyed
    asyncio.run(index.stop())


def test_an_engine_with_another_block_size_is_left_out_and_counted() -> None:
    index = _index()
    tokens = piece_ids(chat_prompt(MESSAGES).key)
    index._take("e0", EventBatch(1.0, (_stored(tokens, block=32),)))
    assert index.index.blocks("e0") == 0 and index.mismatched == len(tokens) // 32
    assert index.view()["orphans"] == index.mismatched  # isle_router_kv_event_orphans counts them
    asyncio.run(index.stop())


def test_a_replica_that_does_not_publish_is_not_keyed() -> None:
    index = _index()
    body = {"model": MODEL, "messages": MESSAGES}
    assert _view(index, body, publishes=False) == CacheView()  # the scorer falls back to the prompt hash
    assert _view(index, body).cacheable_tokens > 0
    asyncio.run(index.stop())


def test_the_plain_index_keys_extra_keys_per_block() -> None:
    tokens = list(range(64))
    index = BlockIndex()
    index.apply("r", EventBatch(1.0, (_stored(tokens, extra=(None, ("x",), None, None)),)))
    plain = BlockIndex()
    plain.apply("r", EventBatch(1.0, (_stored(tokens),)))
    from kvblocks.keys import block_keys
    keys = block_keys(tokens, 16)
    assert plain.leading("r", keys) == 4 and index.leading("r", keys) == 1  # the salt from the second block on
