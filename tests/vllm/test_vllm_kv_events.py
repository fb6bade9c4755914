"""The KV-event contract against vLLM 0.32 itself: vLLM's own `ZmqEventPublisher` and event
classes publish on loopback, the router's subscriber (`wire.kvevents`) receives every batch
(those published before it subscribed through vLLM's replay endpoint), decodes vLLM's encoding,
and vLLM's decoder reads what the simulated engine's publisher encodes."""

from __future__ import annotations

import asyncio
import json
import subprocess
from typing import Any

import pytest

from kvblocks.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from kvblocks.index import BlockIndex
from kvblocks.keys import block_keys
from tests.support.ports import free_ports
from tests.vllm.conftest import PYTHON
from wire.kvevents import Subscriber, encode

pytestmark = pytest.mark.vllm

VLLM_SIDE = """
import json, sys, time
from vllm.distributed.kv_events import (AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch,
                                        ZmqEventPublisher)
import msgspec
pub_port, replay_port, ours = int(sys.argv[1]), int(sys.argv[2]), bytes.fromhex(sys.argv[3])
decoded = msgspec.msgpack.Decoder(KVEventBatch).decode(ours)
print(json.dumps({"decoded": [type(e).__name__ for e in decoded.events], "ts": decoded.ts,
                  "hashes": [list(getattr(e, "block_hashes", [])) for e in decoded.events]}, default=str), flush=True)
pub = ZmqEventPublisher(0, endpoint=f"tcp://127.0.0.1:{pub_port}", replay_endpoint=f"tcp://127.0.0.1:{replay_port}",
                        topic="kv")
tokens = list(range(100, 148))
def stored(hashes, parent, toks):
    return BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=toks, block_size=16, lora_id=None,
                       medium="GPU", lora_name=None)
pub.publish(KVEventBatch(ts=1.0, events=[stored([b"a" * 32, b"b" * 32], None, tokens[:32])]))
pub.publish(KVEventBatch(ts=2.0, events=[stored([b"c" * 32], b"b" * 32, tokens[32:48])]))
print("published-before", flush=True)
sys.stdin.readline()  # the subscriber is up
pub.publish(KVEventBatch(ts=3.0, events=[BlockRemoved(block_hashes=[b"c" * 32], medium="GPU")]))
pub.publish(KVEventBatch(ts=4.0, events=[AllBlocksCleared()]))
time.sleep(1.0)
pub.shutdown()
print("done", flush=True)
"""



def test_vllms_publisher_and_decoder_agree_with_ours() -> None:
    pub_port, replay_port = free_ports(2)
    ours = encode(EventBatch(9.0, (BlockStored((5, 6), None, tuple(range(32)), 16, None, "GPU"),
                                   BlockRemoved((5,), "GPU"), AllBlocksCleared())))
    with subprocess.Popen([str(PYTHON), "-c", VLLM_SIDE, str(pub_port), str(replay_port), ours.hex()],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as proc:
        try:
            _check(proc, pub_port, replay_port)
        finally:
            if proc.poll() is None:
                proc.kill()


def _check(proc: subprocess.Popen[str], pub_port: int, replay_port: int) -> None:
    """vLLM's side decoded ours; ours receives vLLM's, replayed and live."""
    assert proc.stdout is not None and proc.stdin is not None
    first: dict[str, Any] = json.loads(proc.stdout.readline())
    assert first["decoded"] == ["BlockStored", "BlockRemoved", "AllBlocksCleared"] and first["ts"] == 9.0
    assert first["hashes"][:2] == [[5, 6], [5]]
    assert proc.stdout.readline().strip() == "published-before"
    index, got = BlockIndex(), []

    def take(topic: str, batch: EventBatch) -> None:
        got.append(batch)
        index.apply(topic, batch)

    async def main() -> Subscriber:
        sub = Subscriber(f"tcp://127.0.0.1:{pub_port}", take)  # bound: vLLM's PUB connects to it
        sub.add("kv", f"tcp://127.0.0.1:{replay_port}")
        task = asyncio.create_task(sub.run())
        for _ in range(500):  # up to 10 s: vLLM's publisher thread on a loaded 2-core machine
            await asyncio.sleep(0.02)
            if len(got) == 2:
                break
        keys = block_keys(list(range(100, 148)), 16)
        assert index.leading("kv", keys) == 3  # vLLM's sha256 hashes keyed by the tokens they carry
        await asyncio.sleep(0.3)  # the SUB connection settles before vLLM publishes again
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
        for _ in range(500):  # up to 10 s: vLLM's publisher thread on a loaded 2-core machine
            await asyncio.sleep(0.02)
            if len(got) == 4:
                break
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return sub

    sub = asyncio.run(main())
    assert [b.ts for b in got] == [1.0, 2.0, 3.0, 4.0] and sub.sources["kv"].missed == 0
    assert got[0].data_parallel_rank == 0 and isinstance(got[2].events[0], BlockRemoved)
    assert index.blocks("kv") == 0  # cleared
    assert proc.wait(timeout=60) == 0
