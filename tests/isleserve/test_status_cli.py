"""`isle status` without a running product says so and exits 1 (the running case is in the
end-to-end test)."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from isleserve.status import main

pytestmark = pytest.mark.unit


def test_status_without_a_router_says_it_cannot_reach_it(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:  # a loopback port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert main(["--url", f"http://127.0.0.1:{port}"]) == 1
    assert "cannot reach the router" in capsys.readouterr().err


def test_status_shows_the_controllers_transport_check_and_kv_path_action() -> None:
    """What the controller found at an engine's start and what it does about bad KV paths, as
    `/admin/plan`'s controller view carries them (control.envcheck, control.kvpaths)."""
    from isleserve.status import render

    controller: dict[str, Any] = {
        "transport_env": {"decode-0": [{"variable": "UCX_TLS", "planned": None, "actual": "tcp,cuda_copy",
                                        "why": "no RDMA transport on an RDMA plan", "node": "a", "gpus": [2, 3]}]},
        "kv_paths": {"action": "replace", "after_s": 120.0, "not_as_planned": {"prefill-0->decode-0": "wrong_path"},
                     "waiting": ["prefill-0->decode-0: wrong_path for 35 s of 120 s"], "cooling_down": ["decode-1"]}}
    state: dict[str, Any] = {
        "url": "http://127.0.0.1:8000", "topology": None, "replicas": {"version": 3, "replicas": []},
        "plan": {"policy": "island-aligned", "topology_fingerprint": "ab88732aef53ce41", "placements": [],
                 "unplaced": [], "controller": controller}}
    shown = render(state)
    assert "  decode-0: UCX_TLS=tcp,cuda_copy, plan -: no RDMA transport on an RDMA plan" in shown
    assert "kv_path_action: replace after 120 s; not as planned: prefill-0->decode-0 wrong_path" in shown
    assert "  waiting: prefill-0->decode-0: wrong_path for 35 s of 120 s" in shown and "cooling down: decode-1" in shown
    quiet = {**controller, "transport_env": {}, "kv_paths": {"action": "none", "after_s": 120.0, "not_as_planned": {},
                                                             "waiting": [], "cooling_down": []}}
    assert "kv_path_action" not in render({**state, "plan": {**state["plan"], "controller": quiet}})
