"""The front door's bookkeeping (wire/limits.py) without sockets: which address a client
counts under, the router's default shares, admission per address and in all, eviction of the
longest idle connection at the cap, bytes taken against both caps, and the /metrics families
summed over workers (router/metrics.py)."""

from __future__ import annotations

import pytest
from prometheus_client.core import Metric

from router.config import RouterConfig
from router.metrics import RouterMetrics, front_door_families
from wire.limits import CAUSES, ServerLimits, client_key, client_share

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("host", "key"), [
    ("127.0.0.2", "127.0.0.2"),
    ("10.1.2.3", "10.1.2.3"),
    ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
    ("2001:db8:1:2:bbbb::9", "2001:db8:1:2::/64"),  # one host's /64: one client
    ("2001:db8:1:3::1", "2001:db8:1:3::/64"),
    ("::ffff:192.0.2.7", "192.0.2.7"),
    ("fe80::1%eth0", "fe80::/64"),
    ("", ""),
])
def test_client_key(host: str, key: str) -> None:
    assert client_key(host) == key


@pytest.mark.parametrize(("connections", "buffered", "body", "expected"), [
    (16384, 512 << 20, 4 << 20, (2048, 64 << 20)),
    (256, 8 << 20, 4 << 20, (64, 8 << 20)),  # at least 64 connections and two bodies
    (1024, 1 << 30, 1 << 20, (128, 128 << 20)),
])
def test_client_share(connections: int, buffered: int, body: int, expected: tuple[int, int]) -> None:
    assert client_share(connections, buffered, body) == expected


def test_router_config_defaults_give_each_address_an_eighth() -> None:
    limits = RouterConfig(require_keys=False, max_connections=4096).limits()
    assert (limits.max_client_connections, limits.max_client_buffered_bytes) == (512, 64 << 20)
    assert limits.idle_timeout_s == 75.0
    behind_proxy = RouterConfig(require_keys=False, max_connections=4096, max_client_connections=10**6,
                                max_client_buffered_bytes=1 << 40, client_idle_timeout_s=5).limits()
    assert (behind_proxy.max_client_connections, behind_proxy.max_client_buffered_bytes) == (4096, 512 << 20)
    assert behind_proxy.idle_timeout_s == 5


def test_engines_have_no_per_client_caps_of_their_own() -> None:
    limits = ServerLimits(max_connections=100, max_buffered_bytes=1000)
    assert (limits.max_client_connections, limits.max_client_buffered_bytes) == (100, 1000)
    assert all(limits.admit_connection("127.0.0.1") for _ in range(100))
    assert not limits.admit_connection("127.0.0.1") and limits.refused == {"connections": 1}


class _Idle:
    def __init__(self, limits: ServerLimits, client: str) -> None:
        self.limits, self.client, self.evicted = limits, client, False

    def evict(self) -> None:
        self.evicted = True
        self.limits.release_connection(self.client)


def test_admission_per_address_then_in_all_with_eviction_of_the_longest_idle() -> None:
    limits = ServerLimits(max_connections=4, max_client_connections=2)
    assert limits.admit_connection("a") and limits.admit_connection("a")
    assert not limits.admit_connection("a")  # its share: refused, whoever else is there
    assert limits.admit_connection("b") and limits.admit_connection("c")
    oldest, newer = _Idle(limits, "a"), _Idle(limits, "b")
    limits.idle[oldest] = None
    limits.idle[newer] = None
    assert limits.admit_connection("d")  # full: the longest idle makes room
    assert oldest.evicted and not newer.evicted and list(limits.idle) == [newer]
    assert limits.client_connections == {"a": 1, "b": 1, "c": 1, "d": 1} and limits.connections == 4
    limits.idle.clear()
    assert not limits.admit_connection("e")  # full, nobody idle: refused
    assert limits.refused == {"client_connections": 1, "idle_evicted": 1, "connections": 1}
    for client in ("a", "b", "c", "d"):
        limits.release_connection(client)
    assert limits.connections == 0 and limits.client_connections == {}


def test_bytes_are_taken_against_the_address_share_and_the_total() -> None:
    limits = ServerLimits(max_buffered_bytes=100, max_client_buffered_bytes=40)
    assert limits.take("a", 40) == ""
    assert limits.take("a", 1) == "client_buffered_bytes"
    assert limits.take("b", 40) == "" and limits.take("c", 20) == ""
    assert limits.take("d", 1) == "buffered_bytes"
    assert limits.buffered_bytes == 100 and limits.client_bytes == {"a": 40, "b": 40, "c": 20}
    limits.add_bytes("a", -40)
    assert limits.take("d", 1) == "" and "a" not in limits.client_bytes
    assert limits.refused == {"client_buffered_bytes": 1, "buffered_bytes": 1}


def _samples(families: list[Metric]) -> dict[str, float]:
    return {f"{s.name}{s.labels.get('cause', '')}": s.value for f in families for s in f.samples
            if not s.name.endswith("_created")}


def test_front_door_metrics_sum_the_workers_and_list_every_cause() -> None:
    own = {"refused": {"connections": 2, "head_too_large": 1}, "connections": 5, "buffered_bytes": 100}
    peer = {"refused": {"connections": 3, "unknown_cause": 7}, "connections": 1, "buffered_bytes": 20}
    seen = _samples(list(front_door_families([own, peer, {}])))
    assert seen["isle_router_front_door_refusals_totalconnections"] == 5
    assert seen["isle_router_front_door_refusals_totalhead_too_large"] == 1
    assert {k for k in seen if k.startswith("isle_router_front_door_refusals_total")} == {
        f"isle_router_front_door_refusals_total{c}" for c in CAUSES}  # a closed set of label values
    assert seen["isle_router_front_door_connections"] == 6 and seen["isle_router_front_door_buffered_bytes"] == 120


def test_router_metrics_render_and_snapshot_the_front_door() -> None:
    metrics, limits = RouterMetrics(), ServerLimits()
    metrics.front_door = limits.view
    limits.refuse("read_timeout")
    assert metrics.snapshot()["front_door"]["refused"] == {"read_timeout": 1}
    text = metrics.render([{"families": {}, "front_door": {"refused": {"read_timeout": 2}}}]).decode()
    assert 'isle_router_front_door_refusals_total{cause="read_timeout"} 3.0' in text


def test_with_none_idle_the_oldest_head_makes_room_once_stalled() -> None:
    now = [100.0]
    limits = ServerLimits(max_connections=3, stalled_head_s=2.0, clock=lambda: now[0])
    heads = [_Idle(limits, c) for c in ("a", "b", "c")]
    for head in heads:
        assert limits.admit_connection(head.client)
        limits.head_begun(head)
        now[0] += 0.5
    assert not limits.admit_connection("d")  # the oldest head is 1.5 s old: it may still be arriving
    now[0] += 0.5
    idle = heads[2]
    limits.head_over(idle)
    limits.idle[idle] = None
    assert limits.admit_connection("d")  # an idle one goes first, however stalled a head
    assert idle.evicted and not heads[0].evicted
    assert limits.admit_connection("e")  # none idle: the oldest head, 2.0 s old, is stalled
    assert heads[0].evicted and not heads[1].evicted and list(limits.heads) == [heads[1]]
    assert limits.refused == {"connections": 1, "idle_evicted": 1, "stalled_head_evicted": 1}
    assert limits.client_connections == {"b": 1, "d": 1, "e": 1} and limits.connections == 3
