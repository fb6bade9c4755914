"""Whether the router still hears from its controller (the wall clock is injected).

The Serve replica's router asks the detached controller actor for its routing table every second.
When the controller is gone (killed and not yet restarted by Ray, or unable to start), nothing
restarts dead engines, yet the router serves on with its last table. Its own health then comes
from the router: past `SILENCE_LIMIT_S` without an answer, `/health` says "degraded" with a reason
("controller not answering for 23 s (last: ...)"), still HTTP 200 (the data plane serves), and
`/metrics` shows `isle_controller_degraded` 1 and `isle_controller_alert{kind="controller_unreachable"}`;
both clear at the next answer. A standalone router (no controller) has no contact and says
nothing of one.

The leader (the router thread that follows the controller) holds a `ControllerContact`; its other
workers get the `Silence` it sees (or None) with the view it pushes them (router.workers).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

SILENCE_LIMIT_S = 10.0
"""How long the controller may not answer before the router says it is degraded (ten follow
ticks: a controller that Ray restarts at once does not raise it)."""
UNREACHABLE = "controller_unreachable"
"""The alert's kind (`isle_controller_alert{kind}`)."""
ERROR_CHARS = 200


@dataclass(frozen=True, slots=True, kw_only=True)
class Silence:
    """The controller has not answered since `answered_s` (wall-clock seconds)."""

    answered_s: float
    error: str
    """What the last failed call said (one line)."""

    def reason(self, now_s: float) -> str:
        return f"controller not answering for {max(0.0, now_s - self.answered_s):.0f} s (last: {self.error})"

    def to_json(self) -> dict[str, Any]:
        return {"answered_s": self.answered_s, "error": self.error}

    @staticmethod
    def from_json(raw: Any) -> Silence | None:
        if not isinstance(raw, Mapping):
            return None
        return Silence(answered_s=float(raw.get("answered_s", 0.0)), error=str(raw.get("error", "")))


def one_line(err: BaseException) -> str:
    """An error as one short line (a Ray error's text carries a traceback)."""
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= ERROR_CHARS else text[:ERROR_CHARS - 3] + "..."


class ControllerContact:
    """When the controller last answered, and what the calls since then said."""

    def __init__(self, clock: Callable[[], float] = time.time, limit_s: float = SILENCE_LIMIT_S) -> None:
        self.clock = clock
        self.limit_s = limit_s
        self.answered_s = clock()
        """The router asked the controller for the table it starts with: that was an answer."""
        self.error = "no call failed yet"

    def answered(self) -> None:
        self.answered_s = self.clock()

    def failed(self, err: BaseException) -> None:
        self.error = one_line(err)

    def silence(self) -> Silence | None:
        """None while the controller answered within the limit."""
        if self.clock() - self.answered_s <= self.limit_s:
            return None
        return Silence(answered_s=self.answered_s, error=self.error)


def silence_health(silence: Silence | None, now_s: float) -> dict[str, Any]:
    """The router's side of the controller's health (control.state.alarms's shape): empty
    while the controller answers."""
    if silence is None:
        return {}
    reason = silence.reason(now_s)
    return {"status": "degraded", "reasons": [reason],
            "alerts": [{"kind": UNREACHABLE, "reason": reason, "since_s": round(silence.answered_s, 3)}]}


def with_silence(health: Mapping[str, Any], silence: Silence | None, now_s: float) -> Mapping[str, Any]:
    """The controller's health as its last plan says it, and the router's silence added."""
    mine = silence_health(silence, now_s)
    if not mine:
        return health
    return {**health, "status": "degraded", "reasons": [*health.get("reasons", ()), *mine["reasons"]],
            "alerts": [*health.get("alerts", ()), *mine["alerts"]]}


def router_health(health: Mapping[str, Any], contact: ControllerContact | None,
                  silence: Silence | None) -> Mapping[str, Any]:
    """What a router says of its controller: the leader from its own contact, another worker
    from the silence its leader pushed (None: it hears), a standalone router the plan's word."""
    if contact is not None:
        return with_silence(health, contact.silence(), contact.clock())
    return with_silence(health, silence, time.time())
