"""The controller's decision on KV-path verdicts (pools.kvrepair): which verdict changes are
events, when a bad pair's decode replica is re-placed, and when not; and the verdicts' wire form
in the router's load report (pools.kvpaths)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pools.autoscale.report import LoadReport
from pools.kvpaths import VERDICTS, PairVerdict, verdicts_from_json
from pools.kvrepair import KvPathAction, RepairState, on_verdicts

pytestmark = pytest.mark.unit

REPLACE = KvPathAction(action="replace", after_s=60.0, cooldown_s=300.0)
RUNNING = frozenset({"prefill-0", "decode-0", "decode-1"})


def v(verdict: str, decode: str = "decode-0", measured: float | None = 12.0) -> PairVerdict:
    return PairVerdict(prefill="prefill-0", decode=decode, verdict=verdict, tier="rdma", measured_gb_s=measured,
                       expected_gb_s=50.0, samples=8)


def test_a_change_is_one_event_with_its_figures_and_why() -> None:
    first = on_verdicts(RepairState(), [v("as_planned", measured=49.0)], 0.0, REPLACE, RUNNING, frozenset())
    assert first.changes == ()  # a new pair as planned: nothing changed
    bad = on_verdicts(first.state, [v("wrong_path")], 5.0, REPLACE, RUNNING, frozenset())
    (change,) = bad.changes
    assert change.to_json() == {
        "pair": "prefill-0->decode-0", "prefill": "prefill-0", "decode": "decode-0", "old": "as_planned",
        "new": "wrong_path", "tier": "rdma", "measured_gb_s": 12.0, "expected_gb_s": 50.0, "samples": 8,
        "avoided": False,
        "why": "measured 12 GB/s against 50 GB/s expected: the signature of a slower link kind than the rdma path "
               "planned"}
    same = on_verdicts(bad.state, [v("wrong_path")], 10.0, REPLACE, RUNNING, frozenset())
    assert same.changes == () and same.replace == ()  # said once; not bad long enough yet
    assert same.waiting == ("prefill-0->decode-0: wrong_path for 5 s of 60 s",)


def test_a_pair_bad_for_after_s_moves_its_decode_once_per_cooldown() -> None:
    state = on_verdicts(RepairState(), [v("failing")], 0.0, REPLACE, RUNNING, frozenset()).state
    due = on_verdicts(state, [v("failing")], 60.0, REPLACE, RUNNING, frozenset())
    (r,) = due.replace
    assert r.replica_id == "decode-0" and r.pair == "prefill-0->decode-0" and "failing for 60 s" in r.reason
    again = on_verdicts(due.state, [v("failing")], 200.0, REPLACE, RUNNING, frozenset())
    assert again.replace == () and "cool-down 300 s" in again.waiting[0]
    later = on_verdicts(again.state, [v("failing")], 361.0, REPLACE, RUNNING, frozenset())
    assert [x.replica_id for x in later.replace] == ["decode-0"]


@pytest.mark.parametrize(("policy", "busy", "running", "waiting"), [
    (KvPathAction(action="none", after_s=60.0), frozenset(), RUNNING, ()),  # events only
    (REPLACE, frozenset({"decode-0"}), RUNNING, ("not serving steadily",)),  # being moved or drained
    (REPLACE, frozenset(), frozenset({"prefill-0"}), ("not serving steadily",)),  # gone from the fleet
])
def test_no_replacement(policy: KvPathAction, busy: frozenset[str], running: frozenset[str],
                        waiting: tuple[str, ...]) -> None:
    state = on_verdicts(RepairState(), [v("wrong_path")], 0.0, policy, running, busy).state
    tick = on_verdicts(state, [v("wrong_path")], 100.0, policy, running, busy)
    assert tick.replace == () and all(w in line for w, line in zip(waiting, tick.waiting, strict=True))


def test_recovery_resets_the_clock_and_one_move_per_pass() -> None:
    both = [v("wrong_path"), v("wrong_path", decode="decode-1")]
    state = on_verdicts(RepairState(), both, 0.0, REPLACE, RUNNING, frozenset()).state
    state = on_verdicts(state, [v("as_planned", measured=48.0), both[1]], 30.0, REPLACE, RUNNING, frozenset()).state
    tick = on_verdicts(state, both, 70.0, REPLACE, RUNNING, frozenset())  # decode-0 bad again since 70 s
    assert [r.replica_id for r in tick.replace] == ["decode-1"]
    tick = on_verdicts(tick.state, both, 130.0, REPLACE, RUNNING, frozenset())
    assert [r.replica_id for r in tick.replace] == ["decode-0"]
    # a pair the router no longer reports (its decode moved) is forgotten
    assert on_verdicts(tick.state, [], 131.0, REPLACE, RUNNING, frozenset()).state.bad_since == {}


def test_verdicts_ride_the_load_report() -> None:
    report = LoadReport(kv_paths=(v("wrong_path"), v("as_planned", decode="decode-1", measured=None)))
    assert LoadReport.from_json(report.to_json()) == report


@pytest.mark.parametrize(("raw", "message"), [
    ("nope", "must be a list"),
    ([{"prefill": "p", "decode": "d", "verdict": "great"}], "verdict must be one of"),
    ([{"prefill": "p", "decode": "d", "verdict": "slow", "measured_gb_s": float("nan")}], "finite number"),
    ([{"prefill": "", "decode": "d", "verdict": "slow"}], "prefill must be a non-empty string"),
    ([{"prefill": "p", "decode": "d", "verdict": "slow", "samples": True}], "samples must be a whole number"),
    ([{"prefill": "p", "decode": "d", "verdict": "slow", "extra": 1}], "unknown keys"),
])
def test_a_broken_verdict_is_refused(raw: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        verdicts_from_json(raw)
    with pytest.raises(ValueError, match=message):
        LoadReport.from_json({"kv_paths": raw})


DECODES = ("decode-0", "decode-1", "decode-2")


@given(st.lists(st.tuples(st.floats(0.0, 50.0), st.lists(st.tuples(st.sampled_from(DECODES),
                                                                     st.sampled_from(VERDICTS)), max_size=3),
                          st.sets(st.sampled_from(DECODES))), max_size=30))
def test_never_more_than_one_move_a_pass_nor_a_busy_or_cooling_replica(
        passes: list[tuple[float, list[tuple[str, str]], set[str]]]) -> None:
    state, now = RepairState(), 0.0
    moved_at: dict[str, float] = {}
    for step_s, reported, busy in passes:
        now += step_s
        verdicts = [v(verdict, decode=d) for d, verdict in dict(reported).items()]
        tick = on_verdicts(state, verdicts, now, REPLACE, RUNNING, frozenset(busy))
        assert len(tick.replace) <= 1
        for r in tick.replace:
            assert r.replica_id not in busy and r.replica_id in RUNNING
            assert now - moved_at.get(r.replica_id, -1e9) >= REPLACE.cooldown_s
            assert now - state.bad_since[("prefill-0", r.replica_id)] >= REPLACE.after_s
            moved_at[r.replica_id] = now
        state = tick.state
