"""The router benchmark's own parts: the fake backend's stamped, synchronised streams and the
per-chunk delivery measurement (the figures in the README come from these)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from router.bench import load
from router.bench.run import _free_port, _spawn

pytestmark = pytest.mark.integration


def test_chunk_delivery_measures_every_stamped_chunk() -> None:
    port = _free_port()
    backend = _spawn([sys.executable, "-m", "router.bench.fake_backend", "--port", str(port)], ready="ready:")
    try:
        delays = asyncio.run(load.chunk_delivery(port, 4, 5, 10.0))
    finally:
        backend.terminate()
        backend.wait(10)
        if backend.stdout is not None:
            backend.stdout.close()
    assert len(delays) == 20  # 4 streams x 5 chunks, each stamped when sent
    assert all(0 <= d < 1.0 for d in delays)
