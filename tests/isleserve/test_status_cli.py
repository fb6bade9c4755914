"""`isle status` without a running product says so and exits 1 (the running case is in the
end-to-end test)."""

from __future__ import annotations

import socket

import pytest

from isleserve.status import main

pytestmark = pytest.mark.unit


def test_status_without_a_router_says_it_cannot_reach_it(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:  # a loopback port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert main(["--url", f"http://127.0.0.1:{port}"]) == 1
    assert "cannot reach the router" in capsys.readouterr().err
