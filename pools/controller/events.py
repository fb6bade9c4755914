"""The controller's record: one JSON line per topology change, plan, routing table, restart,
drain and move in `<state_dir>/events.jsonl`, each with the topology fingerprint it was made for."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("isleserve.controller")


class EventLog:
    def __init__(self, state_dir: str, clock: Callable[[], float] = time.time) -> None:
        self.path = Path(state_dir) / "events.jsonl"
        self.clock = clock
        self.lock = threading.Lock()
        """Starts on worker threads record too (pools.controller.starts): one line at a time."""

    def record(self, kind: str, fingerprint: str, payload: dict[str, Any]) -> None:
        with self.lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            line = json.dumps({"time": round(self.clock(), 3), "kind": kind, "fingerprint": fingerprint, **payload})
            with self.path.open("a") as f:
                f.write(line + "\n")
        log.info("%s %s", kind, line if len(line) < 400 else line[:400] + "...")
