"""An engine's KV-cache events, in vLLM's vocabulary (vllm/distributed/kv_events.py, 0.32): the
fields a prefix index needs, under vLLM's names. Block hashes are the engine's own (bytes or int:
vLLM's depend on its configured hash and seed); `token_ids` are the stored blocks' tokens, in
order, and `parent_block_hash` the hash of the block before the first (None: the prompt's start)."""

from __future__ import annotations

from dataclasses import dataclass, field

BlockHash = bytes | int


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_name: str | None = None
    medium: str | None = None
    lora_id: int | None = None
    """The adapter's integer id on its engine (vLLM's lora_int_id; None: the base model, or not known)."""
    extra_keys: tuple[object, ...] | None = None
    """Per block, what else vLLM hashed into it (a cache salt, media digests, prompt embeddings;
    None entries: nothing): such blocks are another prompt's than their tokens alone say."""


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[BlockHash, ...]
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


Event = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    ts: float
    events: tuple[Event, ...] = field(default_factory=tuple)
    data_parallel_rank: int | None = None
