"""A simulated engine started as a user starts it, with vLLM's `--enable-prefix-caching` and
`--kv-events-config`: two chats sharing a long system prompt, the second's prompt read mostly
from the cache (the engine's own `vllm:prefix_cache_hits`), and a subscriber bound where the
engine publishes that indexes exactly those blocks, keyed from the prompt's tokens."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from typing import Any

import pytest

from kvblocks.events import EventBatch
from kvblocks.index import BlockIndex
from kvblocks.keys import block_keys
from tests.support.engines import running_engine
from tests.support.ports import free_ports
from wire.kvevents import Subscriber
from wire.prompt import chat_prompt
from wire.text import piece_ids

pytestmark = pytest.mark.integration

SYSTEM = "You are a careful assistant for a railway timetable office. " * 40


def _chat(url: str, question: str) -> dict[str, Any]:
    body = {"model": "llama-3.1-8b", "max_tokens": 4,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]}
    req = urllib.request.Request(url + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        answer: dict[str, Any] = json.loads(resp.read())
        return answer


def _metric(base: str, name: str) -> float:
    with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def test_the_engine_publishes_what_it_caches_and_hits_the_shared_start() -> None:
    sub_port, replay_port = free_ports(2)
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{sub_port}",
              "replay_endpoint": f"tcp://127.0.0.1:{replay_port}", "topic": "e0"}
    index, batches = BlockIndex(), []

    def take(topic: str, batch: EventBatch) -> None:
        batches.append(batch)
        index.apply(topic, batch)

    async def main() -> tuple[float, float]:
        sub = Subscriber(f"tcp://127.0.0.1:{sub_port}", take)  # bound before the engine connects
        task = asyncio.create_task(sub.run())
        with running_engine("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--enable-prefix-caching",
                            "--kv-events-config", json.dumps(config)) as engine:
            sub.add("e0", f"tcp://127.0.0.1:{replay_port}")
            await asyncio.to_thread(_chat, engine.url, "When is the first train to Porto?")
            await asyncio.to_thread(_chat, engine.url, "And the last one back?")
            for _ in range(250):
                await asyncio.sleep(0.02)
                if index.blocks("e0") >= 2 * len(SYSTEM) // 4 // 16:
                    break
            queries = await asyncio.to_thread(_metric, engine.base, "vllm:prefix_cache_queries_total")
            hits = await asyncio.to_thread(_metric, engine.base, "vllm:prefix_cache_hits_total")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return queries, hits

    queries, hits = asyncio.run(main())
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "And the last one back?"}]
    keys = block_keys(piece_ids(chat_prompt(messages).key), 16)  # as a router computes them
    shared = len(SYSTEM.encode()) // 4 // 16  # the system prompt's full blocks (its line prefix aside)
    assert hits >= (shared - 1) * 16 and queries > 2 * hits  # the second prompt read its start from the cache
    assert index.leading("e0", keys) == len(keys)  # the index holds the second prompt's every full block
    assert batches and index.orphans == 0
