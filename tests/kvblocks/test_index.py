"""The prefix index a router keeps from engines' KV events: keys that do not depend on the
engine's hash, leading-block matches, removals, clears, and what it cannot key (orphans)."""

from __future__ import annotations

import pytest

from kvblocks.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from kvblocks.index import BlockIndex
from kvblocks.keys import block_keys

pytestmark = pytest.mark.unit

PROMPT = list(range(100, 150))  # 50 tokens: three full blocks of 16


def stored(hashes: list[bytes | int], parent: bytes | int | None, tokens: list[int], lora: str | None = None
           ) -> BlockStored:
    return BlockStored(tuple(hashes), parent, tuple(tokens), 16, lora)


def test_keys_chain_and_ignore_a_partial_last_block() -> None:
    keys = block_keys(PROMPT, 16)
    assert len(keys) == 3 and len(set(keys)) == 3
    assert block_keys(PROMPT[:32] + [7] * 16, 16)[:2] == keys[:2]  # a shared prefix shares its keys
    assert block_keys([0] * 16 + PROMPT[16:48], 16)[1] != keys[1]  # block 2's key covers block 1 too
    assert block_keys(PROMPT, 16, lora="sql")[0] != keys[0]  # an adapter is part of the key
    with pytest.raises(ValueError, match="block_size"):
        block_keys(PROMPT, 0)


def test_the_index_keys_any_engine_hash_alike() -> None:
    index = BlockIndex()
    # two engines hashing differently (bytes from sha256, ints from another hash), stored in two runs
    index.apply("a", EventBatch(1.0, (stored([b"h1", b"h2"], None, PROMPT[:32]),)))
    index.apply("a", EventBatch(2.0, (stored([b"h3"], b"h2", PROMPT[32:48]),)))
    index.apply("b", EventBatch(1.5, (stored([11, 12, 13], None, PROMPT[:48]),)))
    keys = block_keys(PROMPT, 16)
    assert index.leading("a", keys) == 3 and index.leading("b", keys) == 3 and index.leading("c", keys) == 0
    assert index.leading("a", block_keys(PROMPT[:32] + [1] * 16, 16)) == 2
    assert index.leading("a", block_keys(PROMPT, 16, lora="sql")) == 0
    index.apply("a", EventBatch(3.0, (BlockRemoved((b"h2",)),)))
    assert index.leading("a", keys) == 1  # the chain breaks where a block went
    index.apply("b", EventBatch(3.0, (AllBlocksCleared(),)))
    assert index.leading("b", keys) == 0 and index.blocks("b") == 0
    assert index.last_event_ts("a") == 3.0 and index.blocks("a") == 2


def test_a_run_whose_parent_is_unknown_is_counted_not_guessed() -> None:
    index = BlockIndex()
    index.apply("a", EventBatch(1.0, (stored([b"h3"], b"never-seen", PROMPT[32:48]),)))
    assert index.orphans == 1 and index.blocks("a") == 0
    index.apply("a", EventBatch(1.0, (BlockStored((b"x",), None, (1, 2), 16),)))  # tokens do not fill the block
    assert index.orphans == 2
    index.apply("a", EventBatch(1.0, (BlockStored((b"c",), None, tuple(PROMPT[:16]), 16, medium="CPU"),)))
    assert index.blocks("a") == 0  # another medium (vLLM's CPU offload tier) is not GPU cache
    index.forget("a")
    assert list(index.replicas()) == []
