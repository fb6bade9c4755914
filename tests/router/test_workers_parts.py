"""The pure parts behind router workers: metrics merged across workers, the view handed to them,
and per-worker admission limits."""

from __future__ import annotations

import asyncio
import re
from bisect import bisect_left
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client.utils import floatToGoString

from pools.model import SLOClass
from pools.routing import ReplicaEndpoint, RoutingTable
from router.admission import Admission
from router.metrics import BUCKETS, RouterMetrics
from router.workers import read_view, view_bytes
from topology import read_source
from wire.errors import ApiError

pytestmark = pytest.mark.unit


def upper(value_s: float) -> str:
    """The upper bound of the latency bucket that holds `value_s`, as /metrics writes it."""
    return str(floatToGoString(BUCKETS[bisect_left(BUCKETS, value_s)]))  # type: ignore[no-untyped-call]


def _value(text: str, line_start: str) -> float:
    found = [line for line in text.splitlines() if line.startswith(line_start)]
    assert len(found) == 1, (line_start, found)
    return float(found[0].rsplit(" ", 1)[1])


def test_a_scrape_sums_every_worker_series() -> None:
    a, b = RouterMetrics(), RouterMetrics()
    a.child(a.requests, "interactive", "ok").inc(3)
    b.child(b.requests, "interactive", "ok").inc(2)
    b.child(b.requests, "batch", "rejected").inc()
    a.child(a.ttft, "interactive", "decode", "nvlink").observe(0.003)
    b.child(b.ttft, "interactive", "decode", "nvlink").observe(0.2)
    b.child(b.ttft, "interactive", "decode", "cross-node").observe(1.5)
    a.inflight, b.inflight = {"interactive": 2}, {"interactive": 1, "batch": 4}
    a.healthy, b.healthy = {"r1": 1.0, "r2": 1.0}, {"r1": 0.0, "r2": 1.0, "r3": 1.0}
    peer = orjson.loads(orjson.dumps(b.snapshot()))  # as it crosses the socket
    text = a.render([peer]).decode()
    assert _value(text, 'isle_router_requests_total{outcome="ok",slo_class="interactive"}') == 5
    assert _value(text, 'isle_router_requests_total{outcome="rejected",slo_class="batch"}') == 1
    nv = 'pool="decode",slo_class="interactive",tier="nvlink"}'
    assert _value(text, "isle_router_ttft_seconds_count{" + nv) == 2
    assert _value(text, "isle_router_ttft_seconds_sum{" + nv) == pytest.approx(0.203)
    assert _value(text, f'isle_router_ttft_seconds_bucket{{le="{upper(0.003)}",' + nv) == 1
    assert _value(text, f'isle_router_ttft_seconds_bucket{{le="{upper(0.2)}",' + nv) == 2
    assert _value(text, 'isle_router_ttft_seconds_count{pool="decode",slo_class="interactive",tier="cross-node"}') == 1
    assert _value(text, 'isle_router_inflight_requests{slo_class="interactive"}') == 3
    assert _value(text, 'isle_router_inflight_requests{slo_class="batch"}') == 4
    assert _value(text, 'isle_router_replica_healthy{replica="r1"}') == 0  # one worker does not send it traffic
    assert _value(text, 'isle_router_replica_healthy{replica="r2"}') == 1
    assert _value(text, 'isle_router_replica_healthy{replica="r3"}') == 1
    # rendering a merged view leaves the worker's own series as they were
    alone = a.render().decode()
    assert _value(alone, 'isle_router_requests_total{outcome="ok",slo_class="interactive"}') == 3
    assert not re.search(r"tier=\"cross-node\"", alone)


def test_a_sibling_of_another_shape_is_skipped_not_fatal() -> None:
    a = RouterMetrics()
    a.child(a.requests, "standard", "ok").inc()
    odd = {"families": {"isle_router_requests": [[["standard"], 5.0]],  # one label short
                        "isle_router_ttft_seconds": [[["s", "p", "t"], [1, 2], 0.5]]}}  # wrong bucket count
    text = a.render([odd]).decode()
    assert _value(text, 'isle_router_requests_total{outcome="ok",slo_class="standard"}') == 1
    assert "isle_router_ttft_seconds_count" not in text


def test_the_view_survives_the_trip_to_a_worker() -> None:
    topology = read_source("configs/clusters/local-sim.yaml")
    table = RoutingTable(version=7, topology_fingerprint=topology.fingerprint(), replicas=(
        ReplicaEndpoint(replica_id="p0", url="http://127.0.0.1:9001", model="m", pool="prefill", role="prefill",
                        node="h100-0", gpus=(0, 1), island="h100-0/nvl0", tier="nvlink", tp=2, gpu_model="h100-sxm",
                        catalog_model="llama-3.1-8b", health_score=0.5, draining=True),))
    plan = {"policy": "island-aligned", "placements": [{"replica_id": "p0"}]}
    table2, topology2, plan2 = read_view(view_bytes(table, topology, plan))
    assert table2 == table
    assert topology2 is not None and topology2.fingerprint() == topology.fingerprint()
    assert plan2 == plan
    assert read_view(view_bytes(table, None, None))[1:] == (None, None)


def test_each_worker_admits_its_share_of_a_class_limit() -> None:
    batch = SLOClass(name="batch", priority=2, ttft_ms=1, tpot_ms=1, sheddable=True, max_concurrency=5)
    std = SLOClass(name="standard", priority=1, ttft_ms=1, tpot_ms=1)
    adm = Admission({"batch": batch, "standard": std}, share=2)
    assert adm.limits == {"batch": 3, "standard": None}  # ceil: the workers together admit at least the limit
    assert all(adm.enter(batch) for _ in range(3))
    with pytest.raises(ApiError) as err:
        adm.enter(batch)
    assert err.value.status == 429
    assert Admission({"batch": batch}, share=64).limits == {"batch": 1}


def test_a_sibling_that_misses_a_scrape_counts_with_its_last_answer(tmp_path: Path) -> None:
    from router.workers import Siblings, socket_path
    from wire.http import serve_unix
    from wire.reader import Request
    from wire.responder import Responder

    def answer(request: Request, response: Responder) -> None:
        response.send(200, orjson.dumps({"families": {"isle_router_requests": [[["standard", "ok"], 7.0]]}}))

    async def main() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
        siblings = Siblings(tmp_path, 0, 2)
        never = await siblings.snapshots()  # nobody there yet: nothing to count
        server = await serve_unix(answer, socket_path(tmp_path, 1))
        fresh = await siblings.snapshots()
        server.close()
        await server.wait_closed()
        Path(socket_path(tmp_path, 1)).unlink()
        return never, fresh, await siblings.snapshots()

    never, fresh, stale = asyncio.run(main())
    assert never == []
    assert fresh == stale == [{"families": {"isle_router_requests": [[["standard", "ok"], 7.0]]}}]
