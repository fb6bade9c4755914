"""The controller's side of the proof of the path (issue 34): the router's KV-path verdicts in
(`observe`, with every load report, on the actor's call threads), and on each health pass
(`tick`, under the controller's lock) the `kv_path` events of the verdicts that changed and the
re-placements `pools.kvrepair` decides (`kv_path_action: replace`), which the controller carries
out (`ControllerCore.replace_replica`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from pools.kvpaths import AS_PLANNED, PairVerdict, verdicts_from_json
from pools.kvrepair import KvPathAction, RepairState, Replacement, on_verdicts

log = logging.getLogger("isleserve.controller")


class KvPathWatch:
    def __init__(self, policy: KvPathAction, record: Callable[[str, dict[str, Any]], None],
                 clock: Callable[[], float]) -> None:
        self.policy, self.record, self.clock = policy, record, clock
        self.state = RepairState()
        self.latest: tuple[PairVerdict, ...] | None = None
        """The last report's verdicts, not yet taken by a pass (None: no report since)."""
        self.waiting: tuple[str, ...] = ()
        self.lock = threading.Lock()

    def observe(self, doc: Any) -> None:
        """A load report's JSON (its `kv_paths`); ValueError when they are not verdicts."""
        raw = doc.get("kv_paths", []) if isinstance(doc, dict) else None
        verdicts = verdicts_from_json(raw)
        with self.lock:
            self.latest = verdicts

    def tick(self, running: frozenset[str], busy: frozenset[str]) -> tuple[Replacement, ...]:
        """One pass over the last report: its events recorded, the re-placements due returned."""
        with self.lock:
            verdicts, self.latest = self.latest, None
        if verdicts is None:
            return ()
        result = on_verdicts(self.state, verdicts, self.clock(), self.policy, running, busy)
        self.state = result.state
        for c in result.changes:
            self.record("kv_path", c.to_json())
            level = logging.INFO if c.verdict.verdict == AS_PLANNED else logging.WARNING
            log.log(level, "KV path %s: %s -> %s: %s", c.verdict.pair, c.old, c.verdict.verdict, c.why)
        if result.waiting != self.waiting:
            for line in result.waiting:
                log.info("kv_path_action: waiting: %s", line)
        self.waiting = result.waiting
        return result.replace

    def status(self) -> dict[str, Any]:
        """For the plan's controller view: the policy, the pairs not as planned, what waits."""
        return {"action": self.policy.action, "after_s": self.policy.after_s,
                "not_as_planned": {f"{p}->{d}": v for (p, d), v in sorted(self.state.verdicts.items())
                                   if v != AS_PLANNED},
                "waiting": list(self.waiting), "cooling_down": sorted(self.state.replaced_at)}

    def act(self, running: frozenset[str], busy: frozenset[str], replace: Callable[[str, str], list[dict[str, Any]]]
            ) -> None:
        """A pass (`tick`) and its re-placements carried out by `replace(replica_id, reason)` (the
        controller's `replace_replica`: ValueError when it cannot), each a `kv_path_action` event."""
        for r in self.tick(running, busy):
            event: dict[str, Any] = {"replica_id": r.replica_id, "pair": r.pair, "reason": r.reason}
            try:
                event["moves"] = replace(r.replica_id, r.reason)
                event["result"] = "re-placed"
            except ValueError as err:
                event["result"] = f"not re-placed: {err}"
                log.warning("kv_path_action: %s not re-placed: %s", r.replica_id, err)
            self.record("kv_path_action", event)
