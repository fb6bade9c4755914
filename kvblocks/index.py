"""Which replica holds which KV blocks, kept from the engines' events.

Per replica: the engine's block hash -> this project's key (`keys.next_key` of the parent's key,
the block's tokens and its adapter), and the set of keys held. A stored run whose parent the
index does not know (events missed, or published before the index subscribed) cannot be keyed:
it is counted in `orphans` and left out until a replay or the next store of that prefix. GPU
blocks only: events for other media (vLLM's CPU offload tier) are ignored.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kvblocks.events import AllBlocksCleared, BlockHash, BlockRemoved, BlockStored, EventBatch
from kvblocks.keys import ROOT, next_key


@dataclass(slots=True)
class _Replica:
    keys: dict[BlockHash, int] = field(default_factory=dict)
    held: dict[int, int] = field(default_factory=dict)
    """key -> how many engine blocks hold it (two hashes can share a key across hash seeds)."""
    last_ts: float = 0.0


class BlockIndex:
    def __init__(self) -> None:
        self._replicas: dict[str, _Replica] = {}
        self.orphans = 0

    def apply(self, replica: str, batch: EventBatch) -> None:
        r = self._replicas.setdefault(replica, _Replica())
        r.last_ts = max(r.last_ts, batch.ts)
        for event in batch.events:
            if isinstance(event, BlockStored):
                self._store(r, event)
            elif isinstance(event, BlockRemoved):
                if event.medium not in (None, "GPU"):
                    continue
                for h in event.block_hashes:
                    self._drop(r, h)
            elif isinstance(event, AllBlocksCleared):
                r.keys.clear()
                r.held.clear()

    def _store(self, r: _Replica, event: BlockStored) -> None:
        if event.medium not in (None, "GPU"):
            return
        if event.parent_block_hash is None:
            parent: int | None = ROOT
        else:
            parent = r.keys.get(event.parent_block_hash)
        if parent is None or len(event.token_ids) != len(event.block_hashes) * event.block_size:
            self.orphans += len(event.block_hashes)
            return
        extra = event.extra_keys or ()
        for i, h in enumerate(event.block_hashes):
            salt = extra[i] if i < len(extra) else None  # a salted or multimodal block: never a plain prompt's
            parent = next_key(parent, event.token_ids[i * event.block_size:(i + 1) * event.block_size],
                              event.lora_name if salt is None else f"{event.lora_name or ''}\x00extra{salt!r}")
            if h in r.keys:
                continue
            r.keys[h] = parent
            r.held[parent] = r.held.get(parent, 0) + 1

    @staticmethod
    def _drop(r: _Replica, h: BlockHash) -> None:
        key = r.keys.pop(h, None)
        if key is None:
            return
        left = r.held.get(key, 0) - 1
        if left > 0:
            r.held[key] = left
        else:
            r.held.pop(key, None)

    def forget(self, replica: str) -> None:
        """A replica gone, or restarted (its cache starts empty)."""
        self._replicas.pop(replica, None)

    def leading(self, replica: str, keys: Sequence[int]) -> int:
        """How many of a prompt's leading blocks `replica` holds."""
        r = self._replicas.get(replica)
        if r is None:
            return 0
        n = 0
        for k in keys:
            if k not in r.held:
                break
            n += 1
        return n

    def replicas(self) -> Iterable[str]:
        return self._replicas.keys()

    def blocks(self, replica: str) -> int:
        r = self._replicas.get(replica)
        return len(r.held) if r is not None else 0

    def last_event_ts(self, replica: str) -> float | None:
        r = self._replicas.get(replica)
        return r.last_ts if r is not None else None
