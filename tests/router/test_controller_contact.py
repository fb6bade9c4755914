"""When the router does not hear from its controller (router.contact): the controller actor is
gone (killed and not yet restarted by Ray, or unable to start), nothing restarts dead engines,
and the router must say so. Past the limit without an answer it is "degraded" with a reason; the
next answer clears it. The wall clock is injected."""

from __future__ import annotations

import errno
import os

import pytest

from control.state.alarms import Alarms
from router.contact import (
    SILENCE_LIMIT_S,
    UNREACHABLE,
    ControllerContact,
    Silence,
    one_line,
    router_health,
    silence_health,
    with_silence,
)

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self, now_s: float) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def test_silent_past_the_limit_is_degraded_until_it_answers() -> None:
    clock = Clock(100.0)
    contact = ControllerContact(clock)  # the table it starts with was an answer
    assert contact.silence() is None and SILENCE_LIMIT_S == 10.0
    clock.now_s = 105.0
    contact.answered()
    clock.now_s = 110.0
    contact.failed(RuntimeError("The actor died unexpectedly before finishing this task.\n  class_name: X"))
    clock.now_s = 115.0
    assert contact.silence() is None  # 10 s: within the limit
    clock.now_s = 128.0
    silence = contact.silence()
    assert silence == Silence(answered_s=105.0, error="The actor died unexpectedly before finishing this task. "
                                                      "class_name: X")
    assert silence_health(silence, clock()) == {
        "status": "degraded",
        "reasons": ["controller not answering for 23 s (last: The actor died unexpectedly before finishing this "
                    "task. class_name: X)"],
        "alerts": [{"kind": UNREACHABLE, "reason": "controller not answering for 23 s (last: The actor died "
                    "unexpectedly before finishing this task. class_name: X)", "since_s": 105.0}]}
    clock.now_s = 129.0
    contact.answered()
    assert contact.silence() is None
    assert router_health({}, contact, None) == {}


def test_the_limit_is_configurable_and_errors_are_one_short_line() -> None:
    clock = Clock(0.0)
    contact = ControllerContact(clock, limit_s=2.0)
    clock.now_s = 2.5
    assert contact.silence() == Silence(answered_s=0.0, error="no call failed yet")
    assert one_line(TimeoutError()) == "TimeoutError"
    long = one_line(RuntimeError("x" * 500))
    assert len(long) == 200 and long.endswith("...")


def test_the_silence_adds_to_what_the_plan_says() -> None:
    alarms = Alarms(clock=lambda: 5.0)
    alarms.failed("state_save", OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/s/state.json"))
    health = alarms.health()
    silence = Silence(answered_s=50.0, error="Get timed out: some object(s) not ready.")
    merged = with_silence(health, silence, 62.0)
    assert merged["status"] == "degraded" and merged["write_failures"] == health["write_failures"]
    assert merged["reasons"] == [*health["reasons"], "controller not answering for 12 s (last: Get timed out: "
                                                     "some object(s) not ready.)"]
    assert [a["kind"] for a in merged["alerts"]] == ["state_save", UNREACHABLE]
    assert with_silence(health, None, 62.0) is health
    assert router_health({}, None, None) == {}  # a standalone router: nothing of a controller
    assert Silence.from_json(silence.to_json()) == silence and Silence.from_json(None) is None
