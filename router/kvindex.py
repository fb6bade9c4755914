"""The engines' prefix caches as the router sees them: one ZMQ subscriber bound at
`kv_events.endpoint` (each engine's publisher connects to it, its replica id as topic), one
`kvblocks.index.BlockIndex` kept from their events, and the lookup a request's routing needs:
how many of its prompt's leading blocks each replica holds.

A request's blocks are keyed from its first prompt's tokens as the simulated engine reads them
(`wire.text.piece_ids` of `wire.prompt.Prompt.key`, `kvblocks.keys.block_keys`); a real vLLM's
blocks are keyed by the same function from the tokens its events carry, so its prefixes are
indexed as they are, but a request's own keys need the model's tokenizer, which the router does
not have yet: against vLLM replicas the lookup finds nothing and routing falls back to the other
scorers (issue 33). Replicas come and go with the routing table (`follow`); a replica that
leaves, or comes back with a new replay endpoint (a restart: an empty cache), is forgotten.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Mapping

from kvblocks.events import EventBatch
from kvblocks.index import BlockIndex
from kvblocks.keys import block_keys
from pools.routing import ReplicaEndpoint
from wire.kvevents import Subscriber
from wire.text import BYTES_PER_TOKEN, piece_ids

MAX_LOOKUP_TOKENS = 32_768
"""The prompt tokens the router keys per request (about 2 ms of hashing here): past them, a
replica's share of the prompt is taken as it stands."""


class KvIndex:
    def __init__(self, endpoint: str, block_size: int) -> None:
        self.block_size = block_size
        self.index = BlockIndex()
        self.subscriber = Subscriber(endpoint, self._take, on_reset=self.index.forget)
        self._replay: dict[str, str] = {}
        self._task: asyncio.Task[None] | None = None
        self.batches = 0
        self.last_batch_wall_s = 0.0
        self.lag_s = 0.0
        """How long the last batch took from its engine's clock to here (clocks of one host)."""

    def _take(self, topic: str, batch: EventBatch) -> None:
        self.batches += 1
        now = time.time()
        self.last_batch_wall_s = now
        self.lag_s = max(0.0, now - batch.ts)
        self.index.apply(topic, batch)

    def follow(self, replicas: Iterable[ReplicaEndpoint]) -> None:
        """Subscribe to each replica that publishes; forget the ones gone or restarted."""
        want = {r.replica_id: r.kv_events_replay for r in replicas if r.kv_events_replay}
        for rid, replay in list(self._replay.items()):
            if want.get(rid) != replay:
                self.subscriber.remove(rid)
                self.index.forget(rid)
                del self._replay[rid]
        for rid, replay in want.items():
            if rid not in self._replay:
                self.subscriber.add(rid, replay)
                self._replay[rid] = replay

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.subscriber.run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        else:
            self.subscriber.close()

    def lookup(self, prompt_key: str, replicas: Iterable[str]) -> tuple[int, Mapping[str, int]]:
        """(tokens in the prompt's full blocks, replica id -> leading tokens it holds) for these
        replicas, over its first `MAX_LOOKUP_TOKENS` (a longer prompt's start decides the same)."""
        head = prompt_key[:MAX_LOOKUP_TOKENS * BYTES_PER_TOKEN]
        keys = block_keys(piece_ids(head), self.block_size) if head else []
        if not keys:
            return 0, {}
        bs = self.block_size
        held = {rid: n * bs for rid in replicas if (n := self.index.leading(rid, keys))}
        return len(keys) * bs, held

    def view(self) -> dict[str, object]:
        """What /metrics shows (`router.metrics.kv_index_families`)."""
        sources = self.subscriber.sources.values()
        return {"blocks": {rid: self.index.blocks(rid) for rid in self._replay}, "lag_s": self.lag_s,
                "batches": self.batches, "gaps": sum(s.gaps for s in sources), "orphans": self.index.orphans,
                "missed": sum(s.missed for s in sources), "restarts": sum(s.restarts for s in sources),
                "failed": self.subscriber.failed}
