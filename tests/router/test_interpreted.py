"""Without a C compiler the request path runs interpreted from the same source: the router's
OpenAI-client, retry and disconnect tests pass that way too (CI itself runs compiled)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from wire import native

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def test_the_router_passes_interpreted() -> None:
    tests = ["tests/router/test_router.py::test_openai_client_through_the_router",
             "tests/router/test_router.py::test_retries_and_circuit_breaker",
             "tests/router/test_router.py::test_client_disconnect_cancels_the_upstream_request",
             "tests/wire/test_native.py::test_interpreted_on_request_loads_the_python_sources"]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], check=False,
                         cwd=ROOT, env={**os.environ, native.ENV: "1"}, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "4 passed" in run.stdout
