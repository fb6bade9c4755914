"""The engine-side prefix cache (`kvblocks.cache`): hits on shared prefixes, LRU eviction of
freed blocks only, admission that never evicts a pinned block, and events an index turns back
into exactly what the cache holds."""

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


def test_a_shared_prefix_hits_once_computed_and_the_index_agrees() -> None:
    cache, index = PrefixCache(capacity=12, block_size=16), BlockIndex()
    got = cache.start("a", prompt(1))
    assert got is not None and got[0] == 0
    assert cache.start("b", prompt(2)) == (0, [])  # a's blocks are not computed yet: no hit
    stored = cache.computed("a")
    assert len(stored) == 1 and isinstance(stored[0], BlockStored) and len(stored[0].block_hashes) == 3
    index.apply("r", EventBatch(1.0, tuple(stored)))
    c = cache.start("c", prompt(3))
    assert c is not None and c[0] == 2  # the system prompt's two blocks
    keys = block_keys(prompt(3), 16)
    assert index.leading("r", keys) == cache.hit(keys) == 2
    b_keys = block_keys(prompt(2), 16)  # b raced a: it shares a's system blocks, stores its own tail
    assert cache.computed("b") == [BlockStored((b_keys[2],), b_keys[1], tuple(prompt(2)[32:48]), 16)]
    assert cache.computed("c") == [BlockStored((keys[2],), keys[1], tuple(prompt(3)[32:48]), 16)]
    assert cache.free == 12 - 8  # the system prompt's 2, three tails, three partial blocks


def test_only_freed_blocks_are_evicted_a_prompts_tail_before_its_prefix() -> None:
    cache = PrefixCache(capacity=4, block_size=16)
    for rid, tail in (("a", 1), ("b", 2)):
        assert cache.start(rid, prompt(tail, 16)) is not None
        cache.computed(rid)
    assert cache.free == 0 and cache.start("x", [7] * 16) is None  # all pinned: nothing changes
    cache.finish("a")
    cache.finish("b")
    assert cache.free == 4
    got = cache.start("x", [7] * 48)
    assert got is not None and got[0] == 0
    a, b = block_keys(prompt(1, 16), 16), block_keys(prompt(2, 16), 16)
    assert got[1] == [BlockRemoved((a[2], b[2], b[1]))]  # freed order: a's tail, then b's tail, then inward
    assert cache.hit(b) == 1 and cache.hit(a) == 1


def test_growth_finish_and_clear() -> None:
    cache = PrefixCache(capacity=4, block_size=16)
    assert cache.start("a", [5] * 20) is not None  # 2 blocks
    assert cache.grow("a", 32) == (True, [])
    assert cache.grow("a", 33)[0] and cache.free == 1
    assert cache.grow("a", 80) == (False, [])
    assert cache.clear() == [AllBlocksCleared()]  # nothing cached yet; a's own blocks stay a's
    assert cache.free == 1
    cache.computed("a")
    cache.finish("a")
    assert cache.clear() == [AllBlocksCleared()] and cache.free == 4
    with pytest.raises(ValueError, match="capacity"):
        PrefixCache(capacity=0, block_size=16)
