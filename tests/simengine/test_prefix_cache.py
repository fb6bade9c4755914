"""The simulated engine with a prefix cache (`EngineConfig(prefix_caching=True)`): a shared
prompt start is prefilled once, the second request's first token comes sooner, blocks are
evicted least recently freed first under pressure, a preempted request finds its own blocks,
and the events it leaves describe exactly what it caches."""

from __future__ import annotations

import pytest

from kvblocks.events import BlockRemoved, BlockStored, EventBatch
from kvblocks.index import BlockIndex
from kvblocks.keys import block_keys
from physics import catalog
from simengine.cli import link_of_kind
from simengine.core import EngineConfig, EngineCore

pytestmark = pytest.mark.unit

MODEL, GPU = catalog.model("llama-3.1-8b"), catalog.gpu("h100-sxm")
SYSTEM = tuple(range(10_000, 12_048))  # a 2,048-token system prompt


def core(capacity: int | None = None, caching: bool = True) -> EngineCore:
    return EngineCore(EngineConfig(model=MODEL, gpu=GPU, tp=1, link=link_of_kind("nvlink", "h100-sxm"),
                                   prefix_caching=caching, kv_capacity_tokens=capacity))


def first_token(c: EngineCore, rid: str, prompt: tuple[int, ...], max_tokens: int = 4) -> tuple[float, int]:
    """Run `rid` alone to its end: (time to first token, prefill tokens computed)."""
    start, prefilled, first = c.now, 0, None
    c.add(rid, len(prompt), max_tokens, token_ids=prompt)
    while c.has_work():
        result = c.step()
        assert result is not None
        prefilled += result.prefill_tokens
        if first is None and rid in result.tokens:
            first = c.now - start
    assert first is not None
    return first, prefilled


def test_a_shared_start_is_prefilled_once() -> None:
    c, index = core(), BlockIndex()
    ttft_a, pre_a = first_token(c, "a", (*SYSTEM, *range(50)))
    ttft_b, pre_b = first_token(c, "b", (*SYSTEM, *range(100, 150)))
    assert pre_a == 2048 + 50 and pre_b == 50 + 2048 % 16  # b prefills only what follows the cached blocks
    assert ttft_b < 0.5 * ttft_a
    assert c.prefix_queries == 2 * 2098 and c.prefix_hits == 2048
    index.apply("e", EventBatch(0.0, tuple(c.kv_events)))
    assert index.leading("e", block_keys((*SYSTEM, *range(100, 150)), 16)) == 2048 // 16 + 3  # b's own, stored
    off = core(caching=False)
    assert first_token(off, "a", (*SYSTEM, *range(50)))[1] == first_token(off, "b", (*SYSTEM, *range(100, 150)))[1] \
        == 2098 and not off.kv_events


def test_a_whole_prompt_hit_still_computes_its_last_token() -> None:
    c = core()
    first_token(c, "a", SYSTEM)
    assert first_token(c, "b", SYSTEM)[1] == 16  # the last block is recomputed to sample from it


def test_pressure_evicts_the_least_recently_freed_blocks() -> None:
    c = core(capacity=16 * 200)  # 200 blocks
    first_token(c, "a", tuple(range(0, 1600)))  # 100 blocks, then freed
    first_token(c, "b", tuple(range(5000, 6600)))  # 100 more: the cache is full of a's and b's
    c.kv_events.clear()
    first_token(c, "x", tuple(range(9000, 9800)))  # 50 blocks, and a 51st for its outputs
    removed = [h for e in c.kv_events if isinstance(e, BlockRemoved) for h in e.block_hashes]
    a_keys = block_keys(tuple(range(0, 1600)), 16)
    # b's output block had taken a's last (and is empty again): x evicts a's next 50, tail inward
    assert removed == list(reversed(a_keys))[1:51]
    assert c.cache is not None and c.cache.hit(a_keys) == 49
    assert c.cache.hit(block_keys(tuple(range(5000, 6600)), 16)) == 100
    assert any(isinstance(e, BlockStored) for e in c.kv_events)


def test_a_request_that_does_not_fit_pins_nothing_while_it_waits() -> None:
    c = core(capacity=16 * 13)  # 13 blocks
    warm = tuple(range(20_000, 20_128))  # 8 blocks, cached and freed
    first_token(c, "warm", warm)
    c.add("r", 40, 8, token_ids=tuple(range(40)))  # 3 blocks once it decodes: running alongside
    assert c.step() is not None
    c.add("a", 192, 4, token_ids=(*warm, *range(64)))  # 8 blocks hit, 5 more needed: not while r runs
    c.step()
    a = c.seqs["a"]
    assert a in c.waiting and not a.in_cache and a.computed == 0 and a.blocks == 0
    assert c.cache is not None and c.cache.free == 13 - c.seqs["r"].blocks  # a's hits stay evictable
    assert c.prefix_queries == 128 + 40  # counted once admitted: warm and r, not a yet


def test_prompts_of_any_bytes_key_without_overflow() -> None:
    c = core()
    text = tuple(ord(ch) * 1_000_003 for ch in "请总结 Café")  # ids far above 2**31
    first_token(c, "u", text * 10)
    assert c.kv_events
