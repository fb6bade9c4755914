"""Saving the controller's state without ever stopping the controller.

A save that fails (ENOSPC, EDQUOT, EROFS, a link planted at `state.json.tmp`) leaves the last good
`state.json` in place, opens the `state_save` alert (control.state.alarms), records a
`state_save_failed` event (when the event log can still be written) and logs an error once; the
controller goes on from memory: it serves, restarts engines and publishes tables. Every health
pass tries the save again (`retry_due`); the first one that succeeds closes the alert and records
`state_save_recovered`. A controller restarted meanwhile resumes from the last good file (its
replicas are reattached by name, so what it started since is found again or restarted).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from control.state import saved as state
from control.state.alarms import Alarms, describe
from control.state.files import StateFiles

log = logging.getLogger("isleserve.controller")


class StateKeeper:
    def __init__(self, files: StateFiles, alarms: Alarms, record: Callable[[str, dict[str, Any]], None]) -> None:
        self.files, self.alarms, self.record = files, alarms, record
        self.saves = 0
        """Saves that succeeded."""

    @property
    def retry_due(self) -> bool:
        """The last save failed: the next health pass saves again."""
        return self.alarms.open("state_save")

    def save(self, current: state.ControllerState) -> bool:
        """Save; never raises for a failed write. True when the controller's health changed (an
        alert opened or closed), so what it publishes must say so."""
        try:
            state.save(self.files, current)
        except OSError as err:
            opened = self.alarms.failed("state_save", err)
            if opened:
                log.error("state.json not saved (%s): serving and restarting engines from memory; the save is "
                          "tried again every health pass", describe(err))
                self.record("state_save_failed", {"error": describe(err), "table_version": current.table_version})
            return opened
        self.saves += 1
        closed = self.alarms.cleared("state_save")
        if closed is not None:
            log.warning("state.json saved again after %d failed attempt(s)", closed.failures)
            self.record("state_save_recovered", {"failures": closed.failures, "since_s": closed.since_s,
                                                 "table_version": current.table_version})
        return closed is not None
