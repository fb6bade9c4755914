"""The controller's record: one JSON line per topology change, plan, routing table, restart,
drain and move in `<state_dir>/events.jsonl`, each with the topology fingerprint it was made for.

A line that cannot be written (a full disk, a link where the file goes: control.state.files
never writes through one) is lost, not raised: the controller goes on, the `event_log` alert
opens (control.state.alarms) and the line still goes to the controller's log."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from control.state.alarms import Alarms
from control.state.files import StateFiles

log = logging.getLogger("isleserve.controller")
EVENTS = "events.jsonl"


class EventLog:
    def __init__(self, files: StateFiles, alarms: Alarms, clock: Callable[[], float] = time.time) -> None:
        self.files, self.alarms = files, alarms
        self.path = Path(files.directory) / EVENTS
        self.clock = clock
        self.lock = threading.Lock()
        """Starts on worker threads record too (control.starts): one line at a time."""

    def record(self, kind: str, fingerprint: str, payload: dict[str, Any]) -> None:
        with self.lock:
            line = json.dumps({"time": round(self.clock(), 3), "kind": kind, "fingerprint": fingerprint, **payload})
            try:
                self.files.append(EVENTS, (line + "\n").encode())
            except OSError as err:
                if self.alarms.failed("event_log", err):
                    log.error("events.jsonl: %s; events go to this log only until a write succeeds", err)
            else:
                if self.alarms.cleared("event_log") is not None:
                    log.warning("events.jsonl is written again")
        log.info("%s %s", kind, line if len(line) < 400 else line[:400] + "...")
