"""An engine's prefix cache, as vLLM's v1 KV-cache manager keeps one: `capacity` blocks of
`block_size` tokens, and the events it publishes (block hashes are the keys of `keys`).

- `start(request, tokens)`: the prompt's leading blocks already cached are a hit and are
  pinned; blocks for the rest are allocated, the empty ones first, then the least recently
  freed cached block (its key leaves the cache: `BlockRemoved`). None when even evicting every
  unpinned block leaves too few: the request waits, nothing changes.
- `computed(request)`: the prompt's prefill is done; its full blocks not yet cached become
  cached (`BlockStored` per run, parent the block before); one another request cached
  meanwhile is shared and this request's copy freed.
- `grow(request, tokens)`: a running request's context reached `tokens`; a block more when it
  crosses a block boundary (decode). False when none is free.
- `finish(request)`: its cached blocks become evictable, most recently used last and, within a
  request, its last block first (so a prefix outlives what follows it, as in vLLM); the others
  (its partial block, output blocks) return to the empty pool.
- `clear()`: everything unpinned goes (`AllBlocksCleared` when nothing is pinned).

Output tokens are not cached (vLLM caches full blocks of any tokens; a simulated engine's
outputs are made up, so only prompts can be shared).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvblocks.events import AllBlocksCleared, BlockRemoved, BlockStored, Event
from kvblocks.keys import block_keys


@dataclass(slots=True)
class _Request:
    keys: list[int]
    tokens: tuple[int, ...]
    lora: str | None
    pinned: list[int]
    """Keys of cached blocks it uses (the hit, then its own once computed)."""
    private: int
    """Blocks it holds outside the cache (not yet computed, its partial block, outputs)."""
    context: int
    stored: bool = False


@dataclass(slots=True)
class PrefixCache:
    capacity: int
    block_size: int
    empty: int = field(init=False)
    cached: dict[int, int] = field(default_factory=dict, init=False)
    """key -> requests pinning it (0: evictable)."""
    lru: OrderedDict[int, None] = field(default_factory=OrderedDict, init=False)
    """Evictable keys, least recently freed first."""
    requests: dict[str, _Request] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if self.capacity < 1 or self.block_size < 1:
            raise ValueError(f"prefix cache: capacity {self.capacity} and block_size {self.block_size} must be >= 1")
        self.empty = self.capacity

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def hit(self, keys: Sequence[int]) -> int:
        n = 0
        for k in keys:
            if k not in self.cached:
                break
            n += 1
        return n

    @property
    def free(self) -> int:
        """Blocks a new request could get: empty ones and evictable cached ones."""
        return self.empty + len(self.lru)

    def _take(self, n: int, events: list[Event]) -> None:
        from_empty = min(n, self.empty)
        self.empty -= from_empty
        gone = []
        for _ in range(n - from_empty):
            key, _ = self.lru.popitem(last=False)
            del self.cached[key]
            gone.append(key)
        if gone:
            events.append(BlockRemoved(tuple(gone)))

    def start(self, request: str, tokens: Sequence[int], lora: str | None = None) -> tuple[int, list[Event]] | None:
        """(blocks hit, events) or None (module docstring)."""
        if request in self.requests:
            raise ValueError(f"prefix cache: request {request!r} already started")
        keys = block_keys(tokens, self.block_size, lora)
        hit = self.hit(keys)
        need = self.blocks_for(len(tokens)) - hit
        evictable_hits = sum(1 for k in keys[:hit] if self.cached[k] == 0)
        if need > self.free - evictable_hits:
            return None
        for k in keys[:hit]:
            if self.cached[k] == 0:
                self.lru.pop(k, None)
            self.cached[k] += 1
        events: list[Event] = []
        self._take(need, events)
        self.requests[request] = _Request(keys, tuple(tokens), lora, list(keys[:hit]), need, len(tokens))
        return hit, events

    def computed(self, request: str) -> list[Event]:
        r = self.requests[request]
        if r.stored:
            return []
        r.stored = True
        events: list[Event] = []
        run: list[int] = []
        start = len(r.pinned)
        bs = self.block_size

        def flush(end: int) -> None:
            if run:
                parent = r.keys[end - len(run) - 1] if end - len(run) > 0 else None
                events.append(BlockStored(tuple(run), parent, r.tokens[(end - len(run)) * bs:end * bs], bs, r.lora))
                run.clear()

        for i in range(start, len(r.keys)):
            k = r.keys[i]
            if k in self.cached:  # another request cached it meanwhile: share that block, free ours
                flush(i)
                if self.cached[k] == 0:
                    self.lru.pop(k, None)
                self.cached[k] += 1
                self.empty += 1
            else:
                self.cached[k] = 1
                run.append(k)
            r.pinned.append(k)
            r.private -= 1
        flush(len(r.keys))
        return events

    def grow(self, request: str, tokens: int) -> tuple[bool, list[Event]]:
        r = self.requests[request]
        more = self.blocks_for(tokens) - self.blocks_for(r.context)
        if more > self.free:
            return False, []
        r.context = max(r.context, tokens)
        if more <= 0:
            return True, []
        events: list[Event] = []
        self._take(more, events)
        r.private += more
        return True, events

    def finish(self, request: str) -> None:
        r = self.requests.pop(request)
        for k in reversed(r.pinned):  # a prompt's last block first, so it is evicted before its prefix
            self.cached[k] -= 1
            if self.cached[k] == 0:
                self.lru[k] = None
                self.lru.move_to_end(k)
        self.empty += r.private

    def clear(self) -> list[Event]:
        """Drop every evictable block; `AllBlocksCleared` when none was pinned."""
        pinned = any(n > 0 for n in self.cached.values())
        gone = list(self.lru)
        for k in gone:
            del self.cached[k]
        self.empty += len(gone)
        self.lru.clear()
        if not pinned:
            return [AllBlocksCleared()]
        return [BlockRemoved(tuple(gone))] if gone else []
