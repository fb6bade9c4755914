"""What the controller cannot write, as alerts (the wall clock is injected).

A write that fails (a full disk, a link planted where a file goes) never stops the controller:
it goes on serving and restarting engines from what it holds in memory, and says so. Each kind
of write has at most one alert, open from its first failure to the next write of that kind that
succeeds:

- `state_save`: `state.json` (what a restarted controller resumes from) is not current; the save
  is tried again on every health pass, and a restarted controller resumes from the last one that
  was written;
- `event_log`: lines of `events.jsonl` are being lost;
- `bench_record`: a bench record could not be kept (the measurement is used from memory).

The controller's health is "degraded" while any alert is open, with one reason per alert; the
router's `/health` says it (still HTTP 200: the data plane serves), and its `/metrics` show
`isle_controller_degraded` and `isle_controller_write_failures_total` by kind.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

KINDS = ("state_save", "event_log", "bench_record")
WHAT = {"state_save": "saving the controller state (state.json) fails",
        "event_log": "writing the event log (events.jsonl) fails",
        "bench_record": "keeping a bench record fails"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Alert:
    kind: str
    error: str
    since_s: float
    """Wall-clock seconds of the first failure."""
    failures: int

    @property
    def reason(self) -> str:
        return f"{WHAT.get(self.kind, self.kind)}: {self.error}"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "reason": self.reason, "since_s": round(self.since_s, 3), "failures": self.failures}


def describe(err: BaseException) -> str:
    """An OSError as `strerror (errno name)`, path included; anything else as its text."""
    if isinstance(err, OSError) and err.strerror:
        where = f" ({err.filename})" if err.filename else ""
        return f"{err.strerror}{where}"
    return str(err) or type(err).__name__


class Alarms:
    """Open alerts and failure counts per kind (written from the health loop and from start
    workers that record events: a lock keeps each change whole)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._open: dict[str, Alert] = {}
        self.failures: dict[str, int] = dict.fromkeys(KINDS, 0)
        """Every failure since the controller started, by kind (the metric's counter)."""

    def failed(self, kind: str, err: BaseException) -> bool:
        """Count a failure; True when this opens the kind's alert."""
        now_s = self.clock()
        with self._lock:
            self.failures[kind] = self.failures.get(kind, 0) + 1
            old = self._open.get(kind)
            self._open[kind] = Alert(kind=kind, error=describe(err), since_s=old.since_s if old else now_s,
                                     failures=(old.failures if old else 0) + 1)
            return old is None

    def cleared(self, kind: str) -> Alert | None:
        """A write of this kind succeeded: the alert it closes, if one was open."""
        with self._lock:
            return self._open.pop(kind, None)

    def open(self, kind: str) -> bool:
        with self._lock:
            return kind in self._open

    def alerts(self) -> tuple[Alert, ...]:
        with self._lock:
            return tuple(self._open[k] for k in sorted(self._open))

    def signature(self) -> tuple[tuple[str, str], ...]:
        """What the published health shows (a new failure count alone does not change it)."""
        return tuple((a.kind, a.error) for a in self.alerts())

    def health(self) -> dict[str, Any]:
        """`status` ok or degraded, one reason per open alert, the alerts, and the failure counts."""
        alerts = self.alerts()
        with self._lock:
            failures = dict(self.failures)
        return {"status": "degraded" if alerts else "ok", "reasons": [a.reason for a in alerts],
                "alerts": [a.to_json() for a in alerts], "write_failures": failures}
