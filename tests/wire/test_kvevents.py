"""vLLM's KV events on the wire: the msgpack encoding round trip, and the ZMQ publisher and
subscriber on loopback: live batches, a replay of what was published before the subscriber came,
a gap filled from the replay buffer, and what no replay can bring back."""

from __future__ import annotations

import asyncio

import pytest
import zmq

from kvblocks.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from tests.support.ports import free_ports
from wire.kvevents import Publisher, Subscriber, decode, encode

pytestmark = pytest.mark.integration

BATCH = EventBatch(12.5, (BlockStored((b"\x01" * 32, 7), None, tuple(range(32)), 16, "sql", "GPU"),
                          BlockRemoved((7,), "GPU"), AllBlocksCleared()), 1)


def test_a_batch_round_trips_and_garbage_is_refused() -> None:
    assert decode(encode(BATCH)) == BATCH
    with pytest.raises(ValueError, match="not a KV event batch"):
        decode(b"\x93\x01")



def test_live_batches_replays_and_gaps() -> None:
    pub_port, replay_port = free_ports(2)
    endpoint, replay = f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{replay_port}"
    got: list[float] = []

    async def main() -> Subscriber:
        sub = Subscriber(endpoint, lambda topic, b: got.append(b.ts))  # bound; publishers connect
        pub = Publisher(endpoint, replay, topic="kv", buffer_steps=4)
        pub.start()
        for ts in (1.0, 2.0):  # before the subscriber follows this topic: only a replay brings these
            await pub.publish(EventBatch(ts))
        await asyncio.sleep(0.1)
        sub.add("kv", replay)
        task = asyncio.create_task(sub.run())
        for _ in range(100):
            await asyncio.sleep(0.02)
            if got == [1.0, 2.0]:
                break
        await asyncio.sleep(0.2)  # SUB's connection settles
        await pub.publish(EventBatch(3.0))
        pub._seq += 1  # one sequence lost on the way (as a PUB at its high-water mark drops)
        await pub.publish(EventBatch(5.0))
        for _ in range(100):
            await asyncio.sleep(0.02)
            if got and got[-1] == 5.0:
                break
        for ts in (6.0, 7.0, 8.0, 9.0, 10.0):  # more than the buffer keeps
            pub._buffer.append((pub._seq, encode(EventBatch(ts))))
            pub._seq += 1
        await pub.publish(EventBatch(11.0))
        for _ in range(100):
            await asyncio.sleep(0.02)
            if got and got[-1] == 11.0:
                break
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await pub.close()
        return sub

    sub = asyncio.run(main())
    assert got[:3] == [1.0, 2.0, 3.0] and got[3] == 5.0  # the lost one was never in the buffer
    assert got[-1] == 11.0 and 10.0 in got and 6.0 not in got  # the buffer had moved past 6-7
    assert sub.sources["kv"].gaps == 2 and sub.sources["kv"].missed >= 3 and sub.unknown == 0


@pytest.mark.parametrize("url", ["tcp://10.0.0.1:5557", "ipc:///tmp/x", "tcp://127.0.0.1"])
def test_endpoints_off_loopback_or_malformed_are_refused(url: str) -> None:
    with pytest.raises(ValueError, match="KV events endpoint"):
        Subscriber(url, lambda topic, b: None)


def test_a_restarted_publisher_is_followed_again() -> None:
    pub_port, replay_port = free_ports(2)
    endpoint, replay = f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{replay_port}"
    got: list[float] = []
    resets: list[str] = []

    async def until(n: int) -> None:
        for _ in range(250):
            await asyncio.sleep(0.02)
            if len(got) >= n:
                return

    async def main() -> Subscriber:
        sub = Subscriber(endpoint, lambda topic, b: got.append(b.ts), on_reset=resets.append)
        sub.add("kv", replay)
        task = asyncio.create_task(sub.run())
        pub = Publisher(endpoint, replay, topic="kv")
        pub.start()
        await asyncio.sleep(0.3)
        for ts in (1.0, 2.0, 3.0):
            await pub.publish(EventBatch(ts))
        await until(3)
        await pub.close()  # the engine restarts: same endpoints, its sequence from 0 again
        for _ in range(50):  # until ZMQ's I/O thread has let the replay port go
            await asyncio.sleep(0.05)
            try:
                pub = Publisher(endpoint, replay, topic="kv")
                break
            except zmq.ZMQError:
                continue
        pub.start()
        await asyncio.sleep(0.3)
        await pub.publish(EventBatch(10.0))
        await until(4)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await pub.close()
        return sub

    sub = asyncio.run(main())
    assert got == [1.0, 2.0, 3.0, 10.0] and resets == ["kv"] and sub.sources["kv"].restarts == 1
