"""The engine-side prefix cache (`kvblocks.cache`): hits on shared prefixes, blocks cached as
chunks are computed, LRU eviction of freed blocks only (a prompt's tail before its prefix), and
events an index turns back into exactly what the cache holds."""

from __future__ import annotations

import pytest

from kvblocks.cache import PrefixCache
from kvblocks.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from kvblocks.index import BlockIndex
from kvblocks.keys import block_keys

pytestmark = pytest.mark.unit

SYSTEM = list(range(1000, 1032))  # two blocks of 16


def prompt(tail: int, n: int = 20) -> list[int]:
    return SYSTEM + [tail] * n


def run(cache: PrefixCache, rid: str, tokens: list[int]) -> tuple[int, list[object]]:
    """Start, allocate the whole prompt, compute it: (blocks hit, events)."""
    hit = cache.start(rid, tokens)
    ok, events = cache.grow(rid, len(tokens))
    assert ok
    return hit, [*events, *cache.computed(rid, len(tokens))]


def test_a_shared_prefix_hits_once_computed_and_the_index_agrees() -> None:
    cache, index = PrefixCache(capacity=12, block_size=16), BlockIndex()
    assert cache.start("a", prompt(1)) == 0 and cache.grow("a", 52) == (True, [])
    assert cache.start("b", prompt(2)) == 0 and cache.grow("b", 52)[0]  # a not computed yet: no hit
    first = cache.computed("a", 20)  # a first chunk of 20 tokens: one full block
    assert first == [BlockStored((block_keys(prompt(1), 16)[0],), None, tuple(SYSTEM[:16]), 16)]
    stored = cache.computed("a", 52)  # the next chunk: blocks 2 and 3, their parent block 1
    index.apply("r", EventBatch(1.0, (*first, *stored)))
    assert len(stored) == 1 and isinstance(stored[0], BlockStored) and len(stored[0].block_hashes) == 2
    hit, _ = run(cache, "c", prompt(3))
    assert hit == 2
    keys = block_keys(prompt(3), 16)
    b_keys = block_keys(prompt(2), 16)  # b raced a: it shares a's system blocks, stores its own tail
    assert cache.computed("b", 52) == [BlockStored((b_keys[2],), b_keys[1], tuple(prompt(2)[32:48]), 16)]
    assert index.leading("r", keys) == 2 and cache.hit(keys) == 3  # c's own tail is cached, not yet published
    assert cache.free == 12 - 8  # the system prompt's 2, three tails, three partial blocks


def test_only_freed_blocks_are_evicted_a_prompts_tail_before_its_prefix() -> None:
    cache = PrefixCache(capacity=4, block_size=16)
    run(cache, "a", prompt(1, 16))
    run(cache, "b", prompt(2, 16))
    assert cache.free == 0 and cache.start("x", [7] * 16) == 0 and cache.grow("x", 16) == (False, [])
    cache.finish("x")
    cache.finish("a")
    cache.finish("b")
    assert cache.free == 4
    hit, events = run(cache, "x", [7] * 48)
    a, b = block_keys(prompt(1, 16), 16), block_keys(prompt(2, 16), 16)
    assert hit == 0 and events[0] == BlockRemoved((a[2], b[2], b[1]))  # a's tail, b's tail, then inward
    assert cache.hit(b) == 1 and cache.hit(a) == 1


def test_a_preempted_request_hits_its_own_blocks_on_restart() -> None:
    cache = PrefixCache(capacity=8, block_size=16)
    run(cache, "a", prompt(1, 32))  # 4 full blocks
    cache.finish("a")  # preempted
    assert cache.start("a", prompt(1, 32)) == 4 and cache.held("a") == 4


def test_growth_finish_and_clear() -> None:
    cache = PrefixCache(capacity=4, block_size=16)
    assert cache.start("a", [5] * 20) == 0 and cache.grow("a", 20)[0] and cache.held("a") == 2
    assert cache.grow("a", 32) == (True, []) and cache.held("a") == 2
    assert cache.grow("a", 33)[0] and cache.free == 1
    assert cache.grow("a", 80) == (False, []) and cache.held("a") == 3
    assert cache.clear() == [AllBlocksCleared()]  # nothing cached yet; a's own blocks stay a's
    assert cache.free == 1
    cache.computed("a", 20)
    cache.finish("a")
    assert cache.clear() == [AllBlocksCleared()] and cache.free == 4
    with pytest.raises(ValueError, match="capacity"):
        PrefixCache(capacity=0, block_size=16)
