"""The engines' prefix caches as the router sees them: one ZMQ subscriber bound at
`kv_events.endpoint` (each engine's publisher connects to it, its replica id as topic), one
`kvblocks.index.BlockIndex` kept from their events, and the lookup a request's routing needs:
how many of its prompt's leading tokens each replica's cache would give it.

Every engine's blocks are keyed by one function (`kvblocks.keys`) from the tokens its events
carry, whatever hash the engine uses. A request's own keys come from the tokens its engines
read, by engine kind (`ReplicaEndpoint.engine`):

- a simulated engine reads the prompt's text pieces (`wire.text.piece_ids` of
  `wire.prompt.Prompt.key`): keyed here, synchronously;
- a real vLLM replica reads its tokenizer's tokens: the router asks one of the model's vLLM
  replicas that publish events (`POST /tokenize`, `router.kvtokens.RemoteKeys`; a prompt's keys
  are kept in a bounded LRU, so a repeated prompt costs no round trip); while that round trip
  runs the request waits (a coroutine); a failure or timeout routes it without the index
  (`isle_router_kv_tokenize_requests{outcome="failed"}`).

The tokens a replica holds are counted as the engine counts its hits (`vllm:prefix_cache_hits`):
whole blocks, never the prompt's last token (the engine computes it to sample), and
`prompt_tokens` is what it counts as queried (`vllm:prefix_cache_queries`). Replicas come and go
with the routing table (`follow`: every replica that publishes, `ReplicaEndpoint.publishes`); a
replica that leaves, or comes back with a new replay endpoint or URL (a restart: an empty
cache), is forgotten.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

from kvblocks.events import BlockStored, EventBatch
from kvblocks.index import BlockIndex
from pools.routing import ReplicaEndpoint
from router.kvtokens import MAX_LOOKUP_TOKENS, Keyed, RemoteKeys, tokenize_request, usable_keys
from router.upstream import Pool
from wire.kvevents import Subscriber
from wire.text import BYTES_PER_TOKEN, count_tokens, piece_ids

log = logging.getLogger("isleserve.router")
NO_BLOCKS: Mapping[str, int] = MappingProxyType({})


class CacheView(NamedTuple):
    """What the model's replicas' caches hold of one request's (first) prompt."""

    prompt_tokens: int = 0
    """Its tokens as its engines count them (0: not known)."""
    cacheable_tokens: int = 0
    """Tokens an engine could read from its cache: its full blocks before its last token."""
    held: Mapping[str, int] = NO_BLOCKS
    """Replica id -> how many of those leading tokens its cache holds (absent: none)."""


class KvIndex:
    def __init__(self, endpoint: str, block_size: int, *, pool: Pool | None = None, tokenize_timeout_s: float = 0.5,
                 tokenize_cache: int = 4096, clock: Callable[[], float] = time.monotonic) -> None:
        """`pool`: the clients vLLM replicas' /tokenize is asked with (their API key; its own by default)."""
        self.block_size = block_size
        self.index = BlockIndex()
        self.subscriber = Subscriber(endpoint, self._take, on_reset=self.index.forget)
        self.remote = RemoteKeys(pool or Pool(timeout_s=tokenize_timeout_s), block_size, timeout_s=tokenize_timeout_s,
                                 entries=tokenize_cache, clock=clock)
        self._replay: dict[str, tuple[str, str]] = {}
        """Each subscribed replica's (replay endpoint, URL)."""
        self._task: asyncio.Task[None] | None = None
        self._served: dict[str, list[int]] = {}
        """Replica id -> [hit tokens, queried tokens] of the requests routed to it (`served`)."""
        self.batches = 0
        self.mismatched = 0
        """Stored blocks left out: their engine's block size is not `block_size`."""
        self._warned_size = False
        self.last_batch_wall_s = 0.0
        self.lag_s = 0.0
        """How long the last batch took from its engine's clock to here (clocks of one host)."""

    def _take(self, topic: str, batch: EventBatch) -> None:
        self.batches += 1
        now = time.time()
        self.last_batch_wall_s = now
        self.lag_s = max(0.0, now - batch.ts)
        odd = [e for e in batch.events if isinstance(e, BlockStored) and e.block_size != self.block_size]
        if odd:  # an engine with another --block-size: its blocks would never match a request's keys
            self.mismatched += sum(len(e.block_hashes) for e in odd)
            if not self._warned_size:
                self._warned_size = True
                log.warning("replica %s stores blocks of %d tokens, the router keys %d (kv_events.block_size): "
                            "its blocks are left out of the index", topic, odd[0].block_size, self.block_size)
            batch = EventBatch(batch.ts, tuple(e for e in batch.events if e not in odd), batch.data_parallel_rank)
        self.index.apply(topic, batch)

    def follow(self, replicas: Iterable[ReplicaEndpoint]) -> None:
        """Subscribe to each replica that publishes; forget the ones gone or restarted (a new
        replay endpoint or URL: a new engine, an empty cache)."""
        want = {r.replica_id: (r.kv_events_replay, r.url) for r in replicas if r.publishes}
        for rid, source in list(self._replay.items()):
            if want.get(rid) != source:
                self.subscriber.remove(rid)
                self.index.forget(rid)
                del self._replay[rid]
        for rid, source in want.items():
            if rid not in self._replay:
                self.subscriber.add(rid, source[0] or None)
                self._replay[rid] = source

    def served(self, replica: str, hit: int, queried: int) -> None:
        """A request went to `replica` expecting `hit` of its `queried` prompt tokens from its cache."""
        counts = self._served.setdefault(replica, [0, 0])
        counts[0] += hit
        counts[1] += queried

    def per_replica(self) -> dict[str, dict[str, Any]]:
        """Each publishing replica's blocks in the index and the share of its requests' prompt
        tokens it was expected to read from its cache (`isle status`, /admin/replicas)."""
        out: dict[str, dict[str, Any]] = {}
        for rid in self._replay:
            hit, queried = self._served.get(rid, (0, 0))
            out[rid] = {"blocks": self.index.blocks(rid), "hit_tokens": hit, "query_tokens": queried,
                        "hit_ratio": round(hit / queried, 4) if queried else None}
        return out

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.subscriber.run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        else:
            self.subscriber.close()
        await self.remote.aclose()

    def local(self, prompt_key: str, lora: str = "") -> Keyed:
        """A prompt as the simulated engine keys it: its text pieces (over its first
        `MAX_LOOKUP_TOKENS`: a longer prompt's start decides the same)."""
        head = prompt_key[:MAX_LOOKUP_TOKENS * BYTES_PER_TOKEN]
        if not head:
            return Keyed(0, [])
        ids = piece_ids(head)
        tokens = len(ids) if len(head) == len(prompt_key) else count_tokens(prompt_key)
        return Keyed(tokens, usable_keys(ids, tokens, self.block_size, lora))

    def held(self, keyed: Keyed, replicas: Iterable[str]) -> CacheView:
        """What each of `replicas` holds of the prompt `keyed`."""
        keys, bs = keyed.keys, self.block_size
        if not keys:
            return CacheView(keyed.prompt_tokens)
        held = {rid: n * bs for rid in replicas if (n := self.index.leading(rid, keys))}
        return CacheView(keyed.prompt_tokens, len(keys) * bs, held)

    def request(self, model: str, body: Mapping[str, Any], path: str, prompt_key: str,
                endpoints: Sequence[ReplicaEndpoint], lora: str = "") -> CacheView | Coroutine[Any, Any, CacheView]:
        """What the model's replicas hold of a request's (first) prompt, keyed as each engine kind
        reads it (`lora`: the adapter it names, whose blocks are its own); a coroutine when a vLLM
        replica's tokenizer must be asked first (module docstring)."""
        if body.get("cache_salt") is not None:  # vLLM hashes the salt into its blocks: keys the router cannot make
            return CacheView()
        sims = [e.replica_id for e in endpoints if e.model == model and e.engine == "sim" and e.publishes]
        reals = [e for e in endpoints if e.model == model and e.engine == "vllm" and e.publishes]
        view = self.held(self.local(prompt_key, lora), sims) if sims else CacheView()
        if not reals:
            return view
        ids = [e.replica_id for e in reals]
        ask = tokenize_request(body, path, model)
        if isinstance(ask, str):
            self.remote.count(ask)
            return view
        if isinstance(ask, list):
            return _merged(view, self.held(self.remote.ids(ask, lora), ids))
        raw, key, keyed = self.remote.known(ask, lora)
        if keyed is not None:
            return _merged(view, self.held(keyed, ids))
        url = self.remote.pick([e.url for e in reals if e.healthy], key)
        if url is None:
            self.remote.count("unreachable")
            return view
        return self._asked(view, url, raw, key, ids, lora)

    async def _asked(self, view: CacheView, url: str, raw: bytes, key: bytes, ids: list[str],
                     lora: str) -> CacheView:
        keyed = await self.remote.fetch(url, raw, key, lora)
        return view if keyed is None else _merged(view, self.held(keyed, ids))

    def view(self) -> dict[str, object]:
        """What /metrics shows (`router.metrics.kv_index_families`)."""
        sources = self.subscriber.sources.values()
        return {"blocks": {rid: self.index.blocks(rid) for rid in self._replay}, "lag_s": self.lag_s,
                "batches": self.batches, "gaps": sum(s.gaps for s in sources),
                "orphans": self.index.orphans + self.mismatched,
                "missed": sum(s.missed for s in sources), "restarts": sum(s.restarts for s in sources),
                "failed": self.subscriber.failed, "tokenize": dict(self.remote.counts)}


def _merged(sim: CacheView, real: CacheView) -> CacheView:
    """A model served by both engine kinds (unusual): each replica's hold by its own kind's keys,
    the vLLM replicas' count of the prompt."""
    if not sim.held and not sim.cacheable_tokens:
        return real
    return CacheView(real.prompt_tokens or sim.prompt_tokens, max(sim.cacheable_tokens, real.cacheable_tokens),
                     {**sim.held, **real.held})
