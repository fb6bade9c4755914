"""How a router shows its controller's health (control.state.alarms, carried in the plan view
it follows): `/health` says "degraded" with the reasons (HTTP 200 all the same: the data plane
serves), `/metrics` has `isle_controller_*`; a router with no controller says nothing of one."""

from __future__ import annotations

import errno
import json
import os

import pytest

from control.state.alarms import Alarms
from router.metrics import RouterMetrics
from router.routes import controller_health, health_body

pytestmark = pytest.mark.unit


def _plan(alarms: Alarms) -> dict[str, object]:
    return {"policy": "island-aligned", "controller": {"table_version": 3, "health": alarms.health()}}


def test_health_says_degraded_with_the_reasons() -> None:
    alarms = Alarms(clock=lambda: 5.0)
    assert json.loads(health_body(2, None)) == {"status": "ok", "replicas": 2}  # standalone
    assert json.loads(health_body(2, _plan(alarms))) == {"status": "ok", "replicas": 2}
    alarms.failed("state_save", OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/s/state.json"))
    assert json.loads(health_body(2, _plan(alarms))) == {
        "status": "degraded", "replicas": 2,
        "reasons": ["saving the controller state (state.json) fails: No space left on device (/s/state.json)"]}
    assert controller_health({"controller": {"health": "nonsense"}}) == {}


def test_metrics_show_the_controller_health() -> None:
    metrics = RouterMetrics()
    assert b"isle_controller_" not in metrics.render()  # no controller: no series
    alarms = Alarms()
    alarms.failed("event_log", OSError(errno.ELOOP, os.strerror(errno.ELOOP)))
    alarms.failed("event_log", OSError(errno.ELOOP, os.strerror(errno.ELOOP)))
    metrics.controller = controller_health(_plan(alarms))
    text = metrics.render().decode()
    assert "isle_controller_degraded 1.0" in text
    assert 'isle_controller_alert{kind="event_log"} 1.0' in text
    assert 'isle_controller_write_failures_total{kind="event_log"} 2.0' in text
    assert 'isle_controller_write_failures_total{kind="state_save"} 0.0' in text
    alarms.cleared("event_log")
    metrics.controller = controller_health(_plan(alarms))
    assert "isle_controller_degraded 0.0" in metrics.render().decode()
