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
        delays, none = asyncio.run(load.chunk_delivery(port, 4, 5, 10.0))
        mine, peer = asyncio.run(load.chunk_delivery(port, 3, 5, 10.0, peer=port, rounds=2))
        lat, lat_peer = asyncio.run(load.open_loop(port, 50, 0.4, warmup_s=0.2, peer=port))
        ttfc, ttfc_peer = asyncio.run(load.streams(port, 4, 2, peer=port))
    finally:
        backend.stop()
    assert len(delays) == 20 and none == []  # 4 streams x 5 chunks, each stamped when sent
    assert all(0 <= d < 1.0 for d in delays)
    assert len(mine) == len(peer) == 30  # 2 alternating rounds of 3 streams x 5 chunks on each side
    assert len(lat) == len(lat_peer) == 20 and all(0 < x < 1.0 for x in lat + lat_peer)  # 0.4 s at 50 req/s each
    assert len(ttfc) == len(ttfc_peer) == 8 and all(0 < x < 1.0 for x in ttfc + ttfc_peer)
