"""The open token routes' budget for callers without a key (router.routes.KeylessBudget): a token
bucket of request bytes, waits while it is short, refuses past the longest wait."""

from __future__ import annotations

import pytest

from router.routes import KeylessBudget

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_passes_then_requests_wait_for_their_bytes_then_are_refused() -> None:
    clock = Clock()
    budget = KeylessBudget(1000.0, burst_s=2.0, max_wait_s=3.0, clock=clock)
    assert budget.wait(2000) == 0.0  # the burst: 2 s of it
    assert budget.wait(500) == pytest.approx(0.5)  # then each byte at the rate
    assert budget.wait(1000) == pytest.approx(1.5)  # queued behind the one before
    assert budget.wait(2000) is None  # it would wait 3.5 s: refused, and takes nothing
    clock.now = 10.0
    assert budget.wait(1500) == 0.0  # refilled, up to the burst only


def test_a_body_larger_than_the_burst_takes_the_whole_bucket_and_zero_means_no_bound() -> None:
    clock = Clock()
    budget = KeylessBudget(100.0, burst_s=1.0, clock=clock)
    assert budget.wait(10_000) == 0.0 and budget.wait(1) == pytest.approx(0.01)  # the next waits for its own
    assert KeylessBudget(0.0).wait(10**9) == 0.0
