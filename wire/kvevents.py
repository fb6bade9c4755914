"""vLLM's KV-cache events on the wire (vLLM 0.32, `vllm/distributed/kv_events.py`): the msgpack
encoding, and its ZMQ transport, publisher and subscriber, on loopback.

Encoding: an `EventBatch` is a msgpack array `[ts, events, data_parallel_rank]`; each event a map
tagged `"type": "BlockStored" | "BlockRemoved" | "AllBlocksCleared"` with vLLM's field names
(fields vLLM leaves at their defaults are omitted; fields this decoder does not know, newer
vLLM's, are skipped). Transport: a PUB socket sends `(topic, seq, payload)` frames, `seq` an
8-byte big-endian count from 0 per publisher; a ROUTER socket answers a DEALER's request (an
empty frame and the 8-byte first sequence wanted) with every buffered batch from there, as
`(b"", topic, seq, payload)`, then `(b"", b"", -1 as 8 signed bytes, b"")`. vLLM's PUB socket
binds a wildcard endpoint (`tcp://*:P`, every interface) and connects to any other; its replay
socket always binds. So with `--kv-events-config '{"enable_kv_cache_events": true, "publisher":
"zmq", "endpoint": "tcp://127.0.0.1:P", "replay_endpoint": "tcp://127.0.0.1:R", "topic": T}'`
each engine connects to a subscriber bound on P (one for all engines, told apart by topic) and
serves its own replays on R (DP rank k: P+k and R+k).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from kvblocks.events import AllBlocksCleared, BlockRemoved, BlockStored, Event, EventBatch
from wire.client import is_loopback

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class _Stored(msgspec.Struct, tag="BlockStored", omit_defaults=True):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None


class _Removed(msgspec.Struct, tag="BlockRemoved", omit_defaults=True):
    block_hashes: list[bytes | int]
    medium: str | None


class _Cleared(msgspec.Struct, tag="AllBlocksCleared", omit_defaults=True):
    pass


class _Batch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[_Stored | _Removed | _Cleared]
    data_parallel_rank: int | None = None


_DECODER = msgspec.msgpack.Decoder(_Batch)
_ENCODER = msgspec.msgpack.Encoder()


def decode(payload: bytes) -> EventBatch:
    """A batch from its msgpack payload; ValueError when it is not one."""
    try:
        raw = _DECODER.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as err:
        raise ValueError(f"not a KV event batch: {err}") from None
    events: list[Event] = []
    for e in raw.events:
        if isinstance(e, _Stored):
            events.append(BlockStored(tuple(e.block_hashes), e.parent_block_hash, tuple(e.token_ids), e.block_size,
                                      e.lora_name, e.medium, e.lora_id,
                                      tuple(_hashable(k) for k in e.extra_keys) if e.extra_keys else None))
        elif isinstance(e, _Removed):
            events.append(BlockRemoved(tuple(e.block_hashes), e.medium))
        else:
            events.append(AllBlocksCleared())
    return EventBatch(raw.ts, tuple(events), raw.data_parallel_rank)


def _hashable(value: Any) -> object:
    """msgpack arrays come as lists: the tuples vLLM hashed."""
    return tuple(_hashable(v) for v in value) if isinstance(value, list) else value


def encode(batch: EventBatch) -> bytes:
    events: list[_Stored | _Removed | _Cleared] = []
    for e in batch.events:
        if isinstance(e, BlockStored):
            events.append(_Stored(list(e.block_hashes), e.parent_block_hash, list(e.token_ids), e.block_size,
                                  e.lora_id, e.medium, e.lora_name, list(e.extra_keys) if e.extra_keys else None))
        elif isinstance(e, BlockRemoved):
            events.append(_Removed(list(e.block_hashes), e.medium))
        else:
            events.append(_Cleared())
    return _ENCODER.encode(_Batch(batch.ts, events, batch.data_parallel_rank))


@dataclass(frozen=True, slots=True)
class KvEventsConfig:
    """vLLM's `--kv-events-config` (vllm/config/kv_events.py), the keys a ZMQ publisher uses."""

    endpoint: str
    replay_endpoint: str | None
    """None: no replay (vLLM's default): a subscriber counts what it missed."""
    topic: str = ""
    buffer_steps: int = 10_000


KV_EVENTS_KEYS = frozenset({"enable_kv_cache_events", "publisher", "endpoint", "replay_endpoint", "buffer_steps",
                            "hwm", "max_queue_size", "topic"})


def kv_events_config(text: str) -> KvEventsConfig | None:
    """`--kv-events-config` JSON as vLLM reads it; None when it publishes nothing (events off, or
    the `null` publisher). This project's engines publish on loopback, with a replay endpoint or
    (as vLLM by default) without one."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"--kv-events-config: not JSON ({err.msg})") from None
    if not isinstance(doc, dict):
        raise ValueError("--kv-events-config: want a JSON object")
    unknown = sorted(set(doc) - KV_EVENTS_KEYS)
    if unknown:
        raise ValueError(f"--kv-events-config: unknown keys {unknown} (vLLM's: {sorted(KV_EVENTS_KEYS)})")
    if not doc.get("enable_kv_cache_events") or doc.get("publisher", "zmq") in ("null", None):
        return None
    if doc.get("publisher", "zmq") != "zmq":
        raise ValueError(f"--kv-events-config: publisher {doc['publisher']!r}: zmq or null")
    endpoint, replay = doc.get("endpoint", "tcp://*:5557"), doc.get("replay_endpoint")
    if replay is not None and not isinstance(replay, str):
        raise ValueError("--kv-events-config: replay_endpoint is a tcp://HOST:PORT string")
    if "*" in str(endpoint):
        raise ValueError(f"--kv-events-config: endpoint {endpoint!r} binds every interface; name the "
                         "subscriber's loopback address (tcp://127.0.0.1:PORT)")
    steps = doc.get("buffer_steps", 10_000)
    if not isinstance(steps, int) or steps < 1:
        raise ValueError("--kv-events-config: buffer_steps must be an integer >= 1")
    config = KvEventsConfig(_endpoint(str(endpoint)), _endpoint(replay) if replay else None, str(doc.get("topic", "")),
                            steps)
    return config


def _endpoint(url: str, remote_ok: bool = False) -> str:
    """A tcp://HOST:PORT endpoint; HOST on loopback unless `remote_ok` (a cluster address)."""
    host, sep, port = url.removeprefix("tcp://").rpartition(":")
    host = host.strip("[]")
    if not url.startswith("tcp://") or not sep or not port.isdigit() or not host:
        raise ValueError(f"KV events endpoint {url!r}: want tcp://HOST:PORT")
    if not remote_ok and not is_loopback(host):
        raise ValueError(f"KV events endpoint {url!r}: {host} is not a loopback address")
    return url


def _bind_or_connect(sock: zmq.asyncio.Socket, endpoint: str) -> None:
    """vLLM's rule for its PUB socket: bind a wildcard endpoint, connect to any other."""
    if "*" in endpoint:
        sock.bind(endpoint)
    else:
        sock.connect(endpoint)


class Publisher:
    """PUB + ROUTER replay, as vLLM's `ZmqEventPublisher` (module docstring); asyncio. Like
    vLLM's, the PUB socket binds a wildcard endpoint and connects to any other (a subscriber
    bound there); the replay socket, when there is one, always binds."""

    def __init__(self, endpoint: str, replay_endpoint: str | None, topic: str = "", buffer_steps: int = 10_000,
                 remote_ok: bool = False) -> None:
        endpoint = endpoint if "*" in endpoint else _endpoint(endpoint, remote_ok)
        self._ctx = zmq.asyncio.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._replay = self._ctx.socket(zmq.ROUTER) if replay_endpoint else None
        try:
            _bind_or_connect(self._pub, endpoint)
            if self._replay is not None and replay_endpoint:
                self._replay.bind(_endpoint(replay_endpoint, remote_ok))
        except (zmq.ZMQError, ValueError):
            self._pub.close(linger=0)
            if self._replay is not None:
                self._replay.close(linger=0)
            raise
        self._topic = topic.encode()
        self._seq = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._replay is not None:
            self._task = asyncio.get_running_loop().create_task(self._serve_replay())

    async def publish(self, batch: EventBatch) -> None:
        payload = encode(batch)
        seq = self._seq
        self._seq += 1
        if self._replay is not None:
            self._buffer.append((seq, payload))
        await self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))

    async def _serve_replay(self) -> None:
        assert self._replay is not None
        while True:
            frames = await self._replay.recv_multipart()
            if len(frames) != 3:
                continue
            client, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if seq >= first:
                    await self._replay.send_multipart((client, b"", self._topic, seq.to_bytes(8, "big"), payload))
            await self._replay.send_multipart((client, b"", b"", END_SEQ, b""))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)


class _Source:
    __slots__ = ("gaps", "missed", "next_seq", "replay", "restarts")

    def __init__(self, replay: str | None) -> None:
        self.replay = replay
        self.next_seq: int | None = None
        self.gaps = 0
        self.missed = 0
        self.restarts = 0


class Subscriber:
    """One SUB socket for many publishers, each its own topic (a replica) with its own replay
    endpoint: every batch of each once, in order. With `bind`, the SUB socket binds `endpoint`
    and the engines' PUB sockets connect to it (vLLM with a non-wildcard endpoint; the
    subscriber's port stays on loopback); without, it connects to one publisher that binds. A
    source is replayed from 0 when added (what the engine cached before it was subscribed) and
    from its first missing sequence after a gap; `on_batch(topic, batch)` gets each batch. A live
    sequence number that goes back is a restarted engine: `on_reset(topic)`, then a replay from
    0. Per source: `gaps` seen, batches `missed` (no replay brought them: the publisher's buffer
    had moved on), `restarts`."""

    def __init__(self, endpoint: str, on_batch: Callable[[str, EventBatch], Any], *, bind: bool = True,
                 replay_timeout_s: float = 2.0, remote_ok: bool = False,
                 on_reset: Callable[[str], Any] | None = None) -> None:
        endpoint = _endpoint(endpoint, remote_ok)
        self._remote_ok = remote_ok
        self._ctx = zmq.asyncio.Context.instance()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        try:
            if bind:
                self._sub.bind(endpoint)
            else:
                self._sub.connect(endpoint)
        except zmq.ZMQError:
            self._sub.close(linger=0)
            raise
        self._on_batch = on_batch
        self._on_reset = on_reset
        self._timeout_ms = int(replay_timeout_s * 1000)
        self.sources: dict[str, _Source] = {}
        self._pending: list[str] = []
        self.bad = 0
        self.unknown = 0
        self.failed = 0

    def add(self, topic: str, replay_endpoint: str | None) -> None:
        """Follow a publisher (replayed from 0 on the next turn of `run`)."""
        self.sources[topic] = _Source(_endpoint(replay_endpoint, self._remote_ok) if replay_endpoint else None)
        self._pending.append(topic)

    def remove(self, topic: str) -> None:
        self.sources.pop(topic, None)

    def _take(self, topic: str, source: _Source, seq: int, payload: bytes) -> None:
        if source.next_seq is not None and seq < source.next_seq:
            return  # seen (a replay overlapping the live stream)
        if source.next_seq is not None and seq > source.next_seq:
            source.missed += seq - source.next_seq  # a hole no replay filled
        try:
            batch = decode(payload)
        except ValueError:
            self.bad += 1
            return
        source.next_seq = seq + 1
        self._on_batch(topic, batch)

    async def replay(self, topic: str, first: int) -> None:
        """Ask `topic`'s publisher for every batch from `first` it still has."""
        source = self.sources.get(topic)
        if source is None or source.replay is None:
            return
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.connect(source.replay)
        try:
            await dealer.send_multipart((b"", first.to_bytes(8, "big")))
            if source.next_seq is None:
                source.next_seq = first  # from here on, a hole is a loss (`_take` counts it)
            while await dealer.poll(self._timeout_ms):
                frames = await dealer.recv_multipart()
                if len(frames) != 4 or frames[2] == END_SEQ:
                    break
                self._take(topic, source, int.from_bytes(frames[2], "big"), frames[3])
        finally:
            dealer.close(linger=0)

    def close(self) -> None:
        """For a subscriber that never ran (`run` closes its own)."""
        self._sub.close(linger=0)

    async def run(self) -> None:
        """Until cancelled. A batch that fails in `on_batch` is counted (`failed`), never fatal."""
        try:
            while True:
                try:
                    await self._turn()
                except (asyncio.CancelledError, zmq.ContextTerminated):
                    raise
                except Exception:
                    self.failed += 1
        finally:
            self._sub.close(linger=0)

    async def _turn(self) -> None:
        while self._pending:
            await self.replay(self._pending.pop(0), 0)
        if not await self._sub.poll(100):
            return
        frames = await self._sub.recv_multipart()
        if len(frames) != 3 or len(frames[1]) != 8:
            self.bad += 1
            return
        topic = frames[0].decode(errors="replace")
        source = self.sources.get(topic)
        if source is None:
            self.unknown += 1
            return
        seq = int.from_bytes(frames[1], "big")
        if source.next_seq is not None and seq < source.next_seq:
            # a live sequence number going back: the engine restarted (its cache is new and empty)
            source.restarts += 1
            source.next_seq = None
            if self._on_reset is not None:
                self._on_reset(topic)
            await self.replay(topic, 0)
        if source.next_seq is not None and seq > source.next_seq:
            source.gaps += 1
            await self.replay(topic, source.next_seq)
        self._take(topic, source, seq, frames[2])
