"""A newer routing table: what the router learnt about a replica carries over only while it is the
same engine. A replica whose engine was restarted on another port (or moved) starts with its
breaker closed, and failures of the engine it left (decisions made before the move, a retired
engine cut at its drain timeout) do not count against it: the chaos run found a restarted decode
engine kept out of PD for 6 s by both, all its traffic on one mixed replica meanwhile."""

from __future__ import annotations

import pytest

from pools.routing import ReplicaEndpoint, RoutingTable
from router.state import Replicas

pytestmark = pytest.mark.unit


def table(version: int, url: str) -> RoutingTable:
    return RoutingTable(version=version, replicas=(
        ReplicaEndpoint(replica_id="decode-0", url=url, model="m", pool="decode", role="decode"),
        ReplicaEndpoint(replica_id="mixed-0", url="http://127.0.0.1:9001", model="m", pool="mixed", role="mixed")))


def broken(replicas: Replicas) -> dict[str, bool]:
    return {c.endpoint.replica_id: c.load.breaker_open for c in replicas.snapshot()}


def test_a_restarted_engine_starts_with_its_breaker_closed() -> None:
    replicas = Replicas(table(1, "http://127.0.0.1:9000"), breaker_failures=2, breaker_open_s=60)
    replicas.opened("decode-0")
    for rid in ("decode-0", "decode-0", "mixed-0", "mixed-0"):
        replicas.failed(rid)
    assert broken(replicas) == {"decode-0": True, "mixed-0": True}
    replicas.follow(table(2, "http://127.0.0.1:9100"))  # decode-0's engine came back on another port
    assert broken(replicas) == {"decode-0": False, "mixed-0": True}  # mixed-0 is the same engine
    assert replicas.states["decode-0"].inflight == 1  # the request still open closes against it
    replicas.closed("decode-0")
    assert replicas.states["decode-0"].inflight == 0


def test_the_same_engine_keeps_what_was_learnt() -> None:
    replicas = Replicas(table(1, "http://127.0.0.1:9000"), breaker_failures=1, breaker_open_s=60)
    replicas.ok("decode-0", 12.0)
    replicas.failed("decode-0")
    replicas.follow(table(2, "http://127.0.0.1:9000"))
    state = replicas.states["decode-0"]
    assert state.latency_ms == 12.0 and broken(replicas)["decode-0"]


def test_failures_of_the_engine_a_replica_left_do_not_count() -> None:
    replicas = Replicas(table(1, "http://127.0.0.1:9000"), breaker_failures=1, breaker_open_s=60)
    replicas.follow(table(2, "http://127.0.0.1:9100"))
    replicas.failed("decode-0", "http://127.0.0.1:9000")  # a request routed before the restart
    assert not broken(replicas)["decode-0"]
    replicas.failed("decode-0", "http://127.0.0.1:9100")
    assert broken(replicas)["decode-0"]


def test_a_restarted_controllers_table_is_taken_whatever_its_version() -> None:
    """A controller restarted while its disk was full resumes from the last state it saved: its
    tables may carry versions its predecessor already published. Another epoch is taken anyway;
    within one epoch only a higher version is."""
    from dataclasses import replace

    from router.workers import read_view, view_bytes

    old = replace(table(9, "http://127.0.0.1:9000"), epoch="first")
    replicas = Replicas(old, breaker_failures=2, breaker_open_s=60)
    replicas.follow(replace(table(9, "http://127.0.0.1:9999"), epoch="first"))  # same epoch, same version
    assert replicas.table is old
    resumed = replace(table(6, "http://127.0.0.1:9100"), epoch="second")
    assert resumed.supersedes(old) and not replace(resumed, version=5).supersedes(resumed)
    replicas.follow(resumed)
    assert replicas.table is resumed and replicas.states["decode-0"].endpoint.url == "http://127.0.0.1:9100"
    assert read_view(view_bytes(resumed, None, None))[0] == resumed  # sibling workers get the epoch too
