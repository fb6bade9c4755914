"""A prompt keyed as a vLLM replica reads it (`router.kvtokens`, `router.kvindex.KvIndex.request`):
the /tokenize request a generation request stands for, the keys an engine can hit (never its
last token's block), the LRU, one round trip per prompt at a time, failures routed without the
index and counted."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import orjson
import pytest

from kvblocks.events import BlockStored, EventBatch
from kvblocks.keys import block_keys
from pools.routing import EngineKind, ReplicaEndpoint
from router.kvindex import CacheView, KvIndex
from router.kvtokens import DOWN_S, UNSUPPORTED, RemoteKeys, tokenize_request, usable_keys
from router.upstream import Pool, UpstreamError
from tests.support.ports import free_ports

pytestmark = pytest.mark.unit


def test_chat_requests_ask_with_the_fields_that_render_them() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "priority": 1,
            "add_generation_prompt": False, "continue_final_message": True, "chat_template_kwargs": {"x": 1},
            "documents": [{"title": "t", "text": "d"}], "reasoning_effort": "low", "tools": None}
    assert tokenize_request({**body, "model": "adapter"}, "/v1/chat/completions", "m") == {
        "model": "m", "messages": body["messages"], "add_generation_prompt": False, "continue_final_message": True,
        "chat_template_kwargs": {"x": 1, "documents": body["documents"], "reasoning_effort": "low",
                                 "enable_thinking": True}}
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert tokenize_request({"model": "m", "messages": parts}, "/v1/chat/completions", "m") == {"model": "m",
                                                                                               "messages": parts}


@pytest.mark.parametrize("body, path, want", [
    ({"model": "m", "prompt": "hello"}, "/v1/completions", {"model": "m", "prompt": "hello"}),
    ({"model": "m", "prompt": "hello", "add_special_tokens": False}, "/v1/completions",
     {"model": "m", "prompt": "hello", "add_special_tokens": False}),
    ({"model": "m", "prompt": ["first", "second"]}, "/v1/completions", {"model": "m", "prompt": "first"}),
    ({"model": "m", "prompt": [5, 6, 7]}, "/v1/completions", [5, 6, 7]),
    ({"model": "m", "prompt": [[5, 6], [7]]}, "/v1/completions", [5, 6]),
    ({"model": "m", "input": "hi"}, "/v1/responses", UNSUPPORTED),
    ({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "/v1/chat/completions", UNSUPPORTED),  # vLLM would fetch the image to tokenize it
])
def test_completion_prompts_and_what_is_not_asked(body: dict[str, Any], path: str, want: object) -> None:
    assert tokenize_request(body, path, "m") == want


@pytest.mark.parametrize("tokens, blocks", [(1, 0), (16, 0), (17, 1), (32, 1), (33, 2), (64, 3), (65, 4)])
def test_an_engine_never_hits_its_prompts_last_token(tokens: int, blocks: int) -> None:
    ids = list(range(100, 100 + tokens))
    assert usable_keys(ids, len(ids), 16) == block_keys(ids, 16)[:blocks]


class FakePool(Pool):
    def __init__(self, answers: dict[str, Any]) -> None:
        super().__init__()
        self.answers, self.calls = answers, 0
        self.gate: asyncio.Event | None = None

    async def post_json(self, base: str, path: str, body: bytes) -> tuple[int, Any]:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        answer = self.answers[base]
        if isinstance(answer, Exception):
            raise answer
        if answer == "slow":
            await asyncio.sleep(10)
        if isinstance(answer, int):
            return answer, None
        prompt = orjson.loads(body)["prompt"]
        return 200, {"count": len(prompt), "max_model_len": 100, "tokens": [ord(c) for c in prompt]}


def _remote(answers: dict[str, Any], now: list[float]) -> tuple[RemoteKeys, FakePool]:
    pool = FakePool(answers)
    return RemoteKeys(pool, 4, timeout_s=0.05, entries=2, clock=lambda: now[0]), pool


def test_keys_are_kept_shared_and_a_failing_tokenizer_is_left_alone() -> None:
    now = [0.0]

    async def main() -> None:
        remote, pool = _remote({"http://a": None, "http://b": UpstreamError("refused"), "http://c": "slow",
                                "http://d": 404, "http://e": ValueError("a bug")}, now)
        raw, key, kept = remote.known({"model": "m", "prompt": "abcdefghij"})
        assert kept is None
        pool.gate = asyncio.Event()
        both = asyncio.gather(remote.fetch("http://a", raw, key), remote.fetch("http://a", raw, key))
        await asyncio.sleep(0)
        pool.gate.set()
        first, second = await both
        assert first == second and first is not None and pool.calls == 1
        assert first.prompt_tokens == 10 and list(first.keys) == usable_keys([ord(c) for c in "abcdefghij"], 10, 4)
        assert remote.known({"model": "m", "prompt": "abcdefghij"})[2] == first  # kept: no round trip
        pool.gate = None
        assert await remote.fetch("http://b", *remote.known({"model": "m", "prompt": "x"})[:2]) is None
        assert await remote.fetch("http://c", *remote.known({"model": "m", "prompt": "y"})[:2]) is None  # timed out
        assert await remote.fetch("http://d", *remote.known({"model": "m", "prompt": "z"})[:2]) is None  # refused
        assert await remote.fetch("http://e", *remote.known({"model": "m", "prompt": "w"})[:2]) is None  # logged
        assert {remote.pick(["http://b", "http://c", "http://a", "http://d"], bytes([k])) for k in range(4)} == {
            "http://a", "http://d"}  # spread over those not failing; a 4xx is the request's fault, not the replica's
        now[0] = DOWN_S + 1
        assert remote.pick(["http://b", "http://a"], b"\0") == "http://b"
        for text in ("p", "q", "r"):  # two kept at most: the oldest goes
            await remote.fetch("http://a", *remote.known({"model": "m", "prompt": text})[:2])
        assert remote.known({"model": "m", "prompt": "abcdefghij"})[2] is None
        assert remote.counts == {"cached": 1, "fetched": 4, "shared": 1, "failed": 3, "refused": 1}
        await remote.aclose()

    asyncio.run(main())


def _endpoint(rid: str, engine: EngineKind, url: str = "http://127.0.0.1:1") -> ReplicaEndpoint:
    return ReplicaEndpoint(replica_id=rid, url=url, model="m", pool="p", role="mixed", engine=engine,
                           kv_events_replay="tcp://127.0.0.1:2")


def _stored(tokens: Sequence[int], block_size: int) -> EventBatch:
    n = len(tokens) // block_size
    return EventBatch(1.0, (BlockStored(tuple(range(1, n + 1)), None, tuple(tokens[:n * block_size]), block_size,
                                        None, "GPU"),))


def test_vllm_replicas_are_looked_up_by_their_tokenizers_tokens() -> None:
    async def main() -> None:
        pool = FakePool({"http://127.0.0.1:1": None})
        kv = KvIndex(f"tcp://127.0.0.1:{free_ports(1)[0]}", 4, pool=pool)
        prompt = "abcdefghijklmnop"  # 16 tokens: 3 blocks an engine can hit, its last token's block not
        kv.index.apply("v1", _stored([ord(c) for c in prompt], 4))
        body = {"model": "m", "prompt": prompt}
        endpoints = [_endpoint("v1", "vllm"), _endpoint("v2", "vllm")]
        pending = kv.request("m", body, "/v1/completions", prompt, endpoints)
        assert not isinstance(pending, CacheView)
        assert await pending == CacheView(16, 12, {"v1": 12})
        assert kv.request("m", body, "/v1/completions", prompt, endpoints) == CacheView(16, 12, {"v1": 12})
        assert pool.calls == 1
        assert kv.request("m", {"model": "m", "prompt": [97, 98, 99, 100, 101]}, "/v1/completions", "",
                          endpoints) == CacheView(5, 4, {"v1": 4})
        assert kv.request("m", {"model": "m", "input": "x"}, "/v1/responses", "x", endpoints) == CacheView()
        assert kv.view()["tokenize"] == {"fetched": 1, "cached": 1, "unsupported": 1}
        sim = kv.request("m", body, "/v1/completions", prompt, [_endpoint("s1", "sim")])
        assert sim == CacheView(4, 0, {})  # the simulated model's 4 pieces: no block it could hit
        await kv.stop()

    asyncio.run(main())


def test_an_adapters_blocks_are_its_own() -> None:
    async def main() -> None:
        kv = KvIndex(f"tcp://127.0.0.1:{free_ports(1)[0]}", 4, pool=FakePool({}))
        ids = list(range(100, 117))
        n = len(ids) // 4
        kv.index.apply("v1", EventBatch(1.0, (BlockStored(tuple(range(1, n + 1)), None, tuple(ids[:n * 4]), 4, "ad1",
                                                          "GPU"),)))
        endpoints = [_endpoint("v1", "vllm")]
        body = {"model": "ad1", "prompt": ids}  # token ids: keyed here, with the adapter
        assert kv.request("m", body, "/v1/completions", "", endpoints, "ad1") == CacheView(17, 16, {"v1": 16})
        assert kv.request("m", body, "/v1/completions", "", endpoints) == CacheView(17, 16, {})  # the base's: none
        assert kv.local("abcdefghijklmnopq", "ad1").keys != kv.local("abcdefghijklmnopq").keys
        ask = tokenize_request({"model": "ad1", "prompt": "text"}, "/v1/completions", "m")
        assert ask == {"model": "m", "prompt": "text"}  # the base's tokenizer: the adapter may not be loaded
        assert isinstance(ask, dict) and kv.remote.known(ask, "ad1")[1] != kv.remote.known(ask)[1]  # keys apart
        await kv.stop()

    asyncio.run(main())
