"""`EngineCore.decode_run` (the simulator's fast-forward) is exactly a sequence of `step()`s."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simengine.cli import link_of_kind
from simengine.core import EngineCore
from tests.simengine.test_core import engine

pytestmark = pytest.mark.unit


def _state(core: EngineCore) -> tuple[object, ...]:
    seqs = sorted((s.rid, s.computed, s.output, s.blocks) for s in [*core.running, *core.waiting])
    return round(core.now, 12), core.free_blocks, tuple(seqs)


def _drive(core: EngineCore, fast: bool, until_s: float) -> list[tuple[float, tuple[str, ...]]]:
    """Run to `until_s`; the token events (time, requests) in order."""
    events: list[tuple[float, tuple[str, ...]]] = []
    while core.has_work() and core.now < until_s:
        if fast:
            run = core.decode_run(until_s)
            if run is not None:
                events.extend((round(t, 9), tuple(sorted(run.rids))) for t in run.ends_s)
                continue
        step = core.step()
        if step is None:
            nxt = core.next_ready_s()
            if nxt is None:
                break
            core.advance_to(nxt)
            continue
        if step.tokens:
            events.append((round(core.now, 9), tuple(sorted(step.tokens))))
    return events


@settings(max_examples=40, deadline=None)
@given(requests=st.lists(st.tuples(st.integers(1, 3000), st.integers(1, 300), st.integers(0, 2)), min_size=1,
                         max_size=12),
       capacity=st.sampled_from([None, 4096, 20000]), until=st.sampled_from([0.05, 0.5, math.inf]))
def test_fast_forward_equals_stepping(requests: list[tuple[int, int, int]], capacity: int | None,
                                      until: float) -> None:
    link = link_of_kind("nvlink", "h100-sxm")
    kw = {} if capacity is None else {"kv_capacity_tokens": capacity}
    slow, fast = engine(link, **kw), engine(link, **kw)
    for core in (slow, fast):
        for i, (prompt, out, prio) in enumerate(requests):
            if prompt + out > core.total_blocks * core.config.block_size:
                continue
            core.add(f"r{i}", prompt, out, priority=prio)
    assert _drive(slow, False, until) == _drive(fast, True, until)
    assert _state(slow) == _state(fast)


def test_fast_forward_covers_most_steps_of_a_decode_heavy_batch() -> None:
    core = engine(link_of_kind("nvlink", "h100-sxm"))
    for i in range(32):
        core.add(f"r{i}", 100, 200 + i)
    steps = runs = 0
    while core.has_work():
        run = core.decode_run(math.inf)
        if run is not None:
            runs += 1
            steps += run.steps
        else:
            assert core.step() is not None
    assert steps > 180 * 32 / 32 and runs <= 40  # a few runs carry almost every token step


def test_a_plan_commits_any_prefix_and_then_steps_go_on_identically() -> None:
    link = link_of_kind("nvlink", "h100-sxm")
    a, b = engine(link), engine(link)
    for core in (a, b):
        for i in range(8):
            core.add(f"r{i}", 300, 60 + i)
        while core.decode_plan(math.inf) is None:
            core.step()
    plan = a.decode_plan(math.inf)
    assert plan is not None and plan.steps > 10
    cut = plan.steps_by((plan.ends_s[4] + plan.ends_s[5]) / 2)  # an arrival during step 6: it completes
    assert cut == 6
    a.apply_decode(plan, cut)
    for _ in range(cut):
        b.step()
    assert _state(a) == _state(b)
