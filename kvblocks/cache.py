"""An engine's prefix cache, as vLLM's v1 KV-cache manager keeps one: `capacity` blocks of
`block_size` tokens, the blocks each request holds, and the events it publishes (block hashes
are the keys of `keys`).

- `start(request, tokens)`: the prompt's leading blocks already cached are a hit: the request
  holds them (pinned) from now on; returns how many.
- `grow(request, tokens)`: the request's context is to reach `tokens`: it gets the blocks it
  lacks, the empty ones first, then the least recently freed cached ones (their keys leave the
  cache: `BlockRemoved`). False (and nothing changes) when too few are free.
- `computed(request, tokens)`: its first `tokens` tokens are computed; the prompt's full blocks
  among them that are not cached yet become cached (`BlockStored` per run, parent the block
  before), as vLLM caches each chunk as it is prefilled. A block another request cached
  meanwhile is shared and this request's copy freed.
- `finish(request)`: its cached blocks become evictable (most recently used last and, within a
  request, its last block first, so a prefix outlives what follows it, as in vLLM); its other
  blocks (a partial block, outputs) return to the empty pool. A preempted request finishes too:
  its prompt's blocks stay cached for its restart.
- `adopt(tokens)`: the KV of a prompt's leading full blocks arrived from a peer's cache (a KV
  connector's pull): the blocks not cached yet become cached and evictable, most recently used,
  taking empty blocks first, then the least recently freed (never more than are free).
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
    """Keys of the cached blocks it holds, in prompt order (the hit, then its own once computed)."""
    private: int = 0
    """Blocks it holds outside the cache (not yet computed, its partial block, outputs)."""

    @property
    def held(self) -> int:
        return len(self.pinned) + self.private


@dataclass(slots=True)
class PrefixCache:
    capacity: int
    block_size: int
    empty: int = field(init=False)
    cached: dict[int, int] = field(default_factory=dict, init=False)
    """key -> requests holding it (0: evictable)."""
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
        """Blocks a request could get: empty ones and evictable cached ones."""
        return self.empty + len(self.lru)

    def held(self, request: str) -> int:
        r = self.requests.get(request)
        return r.held if r is not None else 0

    def _pin(self, k: int) -> None:
        if self.cached[k] == 0:
            self.lru.pop(k, None)
        self.cached[k] += 1

    def start(self, request: str, tokens: Sequence[int], lora: str | None = None, limit: int | None = None) -> int:
        """Blocks hit, at most `limit` (module docstring)."""
        if request in self.requests:
            raise ValueError(f"prefix cache: request {request!r} already started")
        keys = block_keys(tokens, self.block_size, lora)
        hit = self.hit(keys) if limit is None else min(self.hit(keys), max(limit, 0))
        for k in keys[:hit]:
            self._pin(k)
        self.requests[request] = _Request(keys, tuple(tokens), lora, list(keys[:hit]))
        return hit

    def grow(self, request: str, tokens: int) -> tuple[bool, list[Event]]:
        r = self.requests[request]
        more = self.blocks_for(tokens) - r.held
        if more <= 0:
            return True, []
        if more > self.free:
            return False, []
        from_empty = min(more, self.empty)
        self.empty -= from_empty
        gone = []
        for _ in range(more - from_empty):
            key, _ = self.lru.popitem(last=False)
            del self.cached[key]
            gone.append(key)
        r.private += more
        return True, [BlockRemoved(tuple(gone))] if gone else []

    def computed(self, request: str, tokens: int) -> list[Event]:
        r = self.requests[request]
        upto = min(tokens // self.block_size, len(r.keys))
        events: list[Event] = []
        run: list[int] = []
        bs = self.block_size

        def flush(end: int) -> None:
            if run:
                first = end - len(run)
                parent = r.keys[first - 1] if first > 0 else None
                events.append(BlockStored(tuple(run), parent, r.tokens[first * bs:end * bs], bs, r.lora))
                run.clear()

        for i in range(len(r.pinned), upto):
            k = r.keys[i]
            if k in self.cached:  # another request cached it meanwhile: share that block, free ours
                flush(i)
                self._pin(k)
                self.empty += 1
            else:
                self.cached[k] = 1
                run.append(k)
            r.pinned.append(k)
            r.private -= 1
        flush(upto)
        return events

    def finish(self, request: str) -> None:
        r = self.requests.pop(request, None)
        if r is None:
            return
        for k in reversed(r.pinned):  # a prompt's last block first, so it is evicted before its prefix
            self.cached[k] -= 1
            if self.cached[k] == 0:
                self.lru[k] = None
                self.lru.move_to_end(k)
        self.empty += r.private

    def adopt(self, tokens: Sequence[int], lora: str | None = None) -> list[Event]:
        keys = block_keys(tokens, self.block_size, lora)
        bs = self.block_size
        events: list[Event] = []
        gone: list[int] = []
        start = self.hit(keys)
        room = self.free
        for k in keys[:start]:  # already here: refreshed (the newest of the evictable), never evicted for the rest
            if self.cached[k] == 0:
                self.lru.move_to_end(k)
                room -= 1
        new: list[int] = []
        for k in keys[start:start + max(room, 0)]:
            if self.empty > 0:
                self.empty -= 1
            else:
                old, _ = self.lru.popitem(last=False)
                del self.cached[old]
                gone.append(old)
            self.cached[k] = 0
            self.lru[k] = None
            new.append(k)
        if gone:
            events.append(BlockRemoved(tuple(gone)))
        if new:
            parent = keys[start - 1] if start > 0 else None
            events.append(BlockStored(tuple(new), parent, tuple(tokens[start * bs:(start + len(new)) * bs]), bs,
                                      lora))
        return events

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
