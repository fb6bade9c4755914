"""Admission by SLO class: a freed slot goes to the class's longest waiter (first come, first
served), never to a request that arrived after it; a waiter that leaves passes its slot on."""

from __future__ import annotations

import asyncio

import pytest

from pools.model import SLOClass
from router.admission import Admission
from wire.errors import ApiError

pytestmark = pytest.mark.unit

STD = SLOClass(name="standard", priority=1, ttft_ms=2000, tpot_ms=100, max_concurrency=1, max_queue_ms=5000)
BATCH = SLOClass(name="batch", priority=2, ttft_ms=30000, tpot_ms=500, sheddable=True, max_concurrency=1)


def test_a_freed_slot_goes_to_the_longest_waiter_not_a_new_arrival() -> None:
    async def main() -> list[str]:
        a = Admission({"standard": STD})
        order: list[str] = []
        assert a.enter(STD)  # the one slot

        async def waiter(name: str) -> None:
            await a.wait(STD)
            order.append(name)

        tasks = []
        for name in ("first", "second", "third"):
            tasks.append(asyncio.create_task(waiter(name)))
            await asyncio.sleep(0)  # queued in this order
        for _ in range(3):
            a.leave(STD)  # one slot freed ...
            assert not a.enter(STD)  # ... and a newcomer still queues behind the waiters
            await asyncio.sleep(0.01)
        a.leave(STD)
        await asyncio.gather(*tasks)
        assert a.inflight["standard"] == 0 and a.queued("standard") == 0
        return order

    assert asyncio.run(main()) == ["first", "second", "third"]


def test_a_waiter_that_times_out_or_leaves_is_not_served_and_passes_nothing_on() -> None:
    async def main() -> None:
        quick = SLOClass(name="standard", priority=1, ttft_ms=2000, tpot_ms=100, max_concurrency=1, max_queue_ms=50)
        a = Admission({"standard": quick})
        assert a.enter(quick)
        with pytest.raises(ApiError) as err:
            await a.wait(quick)
        assert err.value.status == 429 and err.value.cause == "queue_timeout"
        gone = asyncio.create_task(a.wait(quick))
        await asyncio.sleep(0.01)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert a.queued("standard") == 0
        a.leave(quick)
        assert a.inflight["standard"] == 0 and a.enter(quick)  # the slot is free again, nobody holds it

    asyncio.run(main())


def test_a_sheddable_class_at_its_limit_is_shed_with_the_cause() -> None:
    a = Admission({"batch": BATCH})
    assert a.enter(BATCH)
    with pytest.raises(ApiError) as err:
        a.enter(BATCH)
    assert err.value.status == 429 and err.value.cause == "concurrency_limit"
