"""The KV-path verdict (router.plugins.kvpath) and the router's measurements (router.kvwatch):
table-driven raw verdicts, hysteresis over the window, avoidance, cool-down and the probe; NIXL
counters read from vLLM-shaped text served by a real HTTP server on loopback."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator

import pytest

from router.kvwatch import KvWatch, NixlTotals, nixl_totals
from router.plugins import kvpath
from router.plugins.kvpath import KvPathRules, PairState
from router.plugins.pd import pd_pair
from tests.router.test_pd_or_mixed import TOPOLOGY, rep, req
from tests.support.nixl import NIXL_TEXT, serving_nixl

pytestmark = pytest.mark.unit

RULES = KvPathRules(window_s=10.0, avoid_after_s=20.0, cooldown_s=30.0)
GB = 1e-6  # ms per byte at 1 GB/s
NVLINK, RDMA, TCP = GB / 450.0, GB / 50.0, GB / 12.5


@pytest.mark.parametrize(("expected", "observed", "failed", "verdict"), [
    (NVLINK, NVLINK, 0, "as_planned"),
    (NVLINK, NVLINK * 1.9, 0, "as_planned"),  # above slow_fraction 0.5
    (NVLINK, TCP, 0, "wrong_path"),  # TCP speed on an NVLink pair
    (RDMA, TCP, 0, "wrong_path"),
    (RDMA, GB / 12.0, 0, "wrong_path"),
    (NVLINK, NVLINK * 3, 0, "slow"),  # 150 GB/s: no slower kind's signature
    (RDMA, GB / 0.5, 0, "slow"),  # far below every kind
    (NVLINK, NVLINK, 1, "failing"),
    (0.0, TCP, 0, "as_planned"),  # a local handover: nothing to judge
])
def test_classify(expected: float, observed: float, failed: int, verdict: str) -> None:
    assert kvpath.classify(expected, observed, failed, RULES) == verdict


def run(state: PairState, times: list[float], observed: float, expected: float = NVLINK, failed: int = 0
        ) -> PairState:
    for t in times:
        state = kvpath.observe(state, now=t, expected_ms_per_byte=expected, observed_ms_per_byte=observed,
                               failed=failed, rules=RULES)
    return state


def test_one_odd_window_flips_nothing_a_sustained_one_does() -> None:
    s = run(PairState(), [0, 1, 2], NVLINK)
    s = run(s, [3, 4, 5], TCP)
    assert s.raw == "wrong_path" and s.verdict == "as_planned"
    s = run(s, [13, 14], TCP)
    assert s.verdict == "wrong_path" and kvpath.weight(s, RULES) == RULES.penalty
    assert kvpath.open_to(s, 14)  # down-weighted, not yet avoided


def test_failing_is_at_once() -> None:
    s = run(PairState(), [0, 1], NVLINK)
    s = run(s, [2], NVLINK, failed=1)
    assert s.verdict == "failing"


def test_avoided_after_threshold_then_one_probe_after_cooldown() -> None:
    s = run(PairState(), [float(t) for t in range(0, 40)], TCP)  # wrong_path from 10 s, avoided from 30 s
    assert s.verdict == "wrong_path" and s.avoided_until is not None
    assert not kvpath.open_to(s, 40.0)
    until = s.avoided_until
    assert kvpath.open_to(s, until)
    s = kvpath.probed(s)
    assert not kvpath.open_to(s, until)  # one probe at a time
    healed = run(s, [until + 1], NVLINK)
    assert healed.verdict == "as_planned" and healed.avoided_until is None and kvpath.open_to(healed, until + 1)
    still = run(s, [until + 1], TCP)
    assert still.verdict == "wrong_path" and still.avoided_until == until + 1 + RULES.cooldown_s


def test_noise_within_expectation_counts_as_planned() -> None:
    assert kvpath.measured_ms_per_byte(NVLINK, 0.0, 1e8, NVLINK * 1e8 + 4.0, RULES) == NVLINK
    assert kvpath.measured_ms_per_byte(NVLINK, 0.0, 1e8, 8.0, RULES) == 8.0 / 1e8
    assert kvpath.measured_ms_per_byte(NVLINK, 2.0, 1e8, 12.0, RULES) == 10.0 / 1e8  # set-up latency off
    assert kvpath.measured_ms_per_byte(NVLINK, 0.0, 0, 8.0, RULES) is None




@pytest.fixture
def nixl_server() -> Iterator[tuple[str, dict[str, float]]]:
    """A real HTTP server on loopback serving vLLM-shaped NIXL metrics, its values settable."""
    values = {"count": 0.0, "seconds": 0.0, "kv_bytes": 0.0, "failed": 0.0}
    with serving_nixl(lambda: values) as base:
        yield f"{base}/metrics", values


def scrape(url: str) -> NixlTotals | None:
    with urllib.request.urlopen(url, timeout=5) as r:
        return nixl_totals(r.read().decode())


def test_nixl_window_gives_bandwidth_and_failures(nixl_server: tuple[str, dict[str, float]]) -> None:
    url, values = nixl_server
    watch = KvWatch(RULES)
    watch.handover(("p0", "d0"), tier="nvlink", expected_ms_per_byte=NVLINK, kv_bytes=1e8,
                   transfer_ms=NVLINK * 1e8, now=0.0)
    watch.scraped("d0", scrape(url), 0.0)
    values.update(count=10, seconds=0.8, kv_bytes=1e10)  # 12.5 GB/s: TCP speed on an NVLink pair
    watch.handover(("p0", "d0"), tier="nvlink", expected_ms_per_byte=NVLINK, kv_bytes=1e8,
                   transfer_ms=NVLINK * 1e8, now=1.0)
    watch.scraped("d0", scrape(url), 1.0)
    view = watch.view(1.0)
    assert view["decodes"] == {"d0": {"nixl_bandwidth_gb_s": 12.5, "nixl_failed_transfers": 0.0}}
    values.update(failed=2)
    watch.handover(("p0", "d0"), tier="nvlink", expected_ms_per_byte=NVLINK, kv_bytes=1e8,
                   transfer_ms=NVLINK * 1e8, now=2.0)
    watch.scraped("d0", scrape(url), 2.0)
    pairs = watch.view(2.0)["pairs"]
    assert isinstance(pairs, list) and len(pairs) == 1
    pair = pairs[0]
    assert pair["verdict"] == "failing" and pair["pair"] == "p0->d0"


def test_engine_without_nixl_gives_none() -> None:
    assert nixl_totals("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n") is None


def test_pairs_are_capped() -> None:
    watch = KvWatch(RULES, max_pairs=2)
    followed = [watch.handover((f"p{i}", "d"), tier="rdma", expected_ms_per_byte=RDMA, kv_bytes=1e8,
                               transfer_ms=1.0, now=0.0) for i in range(3)]
    assert followed == [True, True, False]


def test_a_pair_left_alone_settles_on_its_last_evidence() -> None:
    s = run(PairState(), [0.0], TCP)  # one slow measurement; the choice then leaves the pair alone
    assert s.verdict == "as_planned" and s.raw == "wrong_path"
    s = kvpath.settle(s, 10.0, RULES)
    assert s.verdict == "wrong_path" and s.avoided_until is None
    s = kvpath.settle(s, 30.0, RULES)
    assert s.avoided_until == 30.0 + RULES.cooldown_s
    assert kvpath.settle(s, 31.0, RULES) is s  # nothing new: the cool-down is not pushed on


def test_the_pair_choice_prices_measured_transfers_and_skips_avoided_pairs() -> None:
    p = rep("p", "prefill", "h100-0", (0,))
    d1, d2 = rep("d1", "decode", "h100-0", (1,)), rep("d2", "decode", "h100-0", (2,))
    r = req(8000)
    plain = pd_pair(r, [p], [d1, d2], TOPOLOGY)
    assert plain is not None and plain.decode.endpoint.replica_id == "d1"  # equal paths: the first
    expected, _, _ = plain.rates["d1"]
    slow = pd_pair(r, [p], [d1, d2], TOPOLOGY, {("p", "d1"): (expected * 40, 1.0, True)})
    assert slow is not None and slow.decode.endpoint.replica_id == "d2"  # measured at TCP speed: the other
    assert slow.kv_ms == plain.kv_ms
    # avoided: never first while an open pair is usable, though the model prices it cheaper
    avoided = pd_pair(r, [p], [d1, d2], TOPOLOGY, {("p", "d2"): (expected * 40, 1.0, True),
                                                    ("p", "d1"): (0.0, 1.0, False)})
    assert avoided is not None and [c.endpoint.replica_id for c in avoided.decode_order] == ["d2", "d1"]
    only = pd_pair(r, [p], [d1], TOPOLOGY, {("p", "d1"): (0.0, 4.0, False)})
    assert only is not None and only.decode.endpoint.replica_id == "d1" and only.kv_ms > plain.kv_ms


def peer_text(p1: tuple[float, float, float], p2: tuple[float, float, float]) -> str:
    """A decode's NIXL counters plus the engine's per-prefill handovers (seconds, count, bytes)."""
    lines = [NIXL_TEXT.replace("{count}", "1.0").replace("{seconds}", "1.0").replace("{kv_bytes}", "1.0")
             .replace("{failed}", "0.0"), "# TYPE isle_engine_kv_transfer_seconds histogram",
             "# TYPE isle_engine_kv_transfer_bytes counter"]
    for peer, (seconds, count, kv_bytes) in (("p1", p1), ("p2", p2)):
        labels = f'engine="0",model_name="m",remote_engine_id="{peer}"'
        lines += [f"isle_engine_kv_transfer_seconds_bucket{{{labels},le=\"+Inf\"}} {count}",
                  f"isle_engine_kv_transfer_seconds_count{{{labels}}} {count}",
                  f"isle_engine_kv_transfer_seconds_sum{{{labels}}} {seconds}",
                  f"isle_engine_kv_transfer_bytes_total{{{labels}}} {kv_bytes}"]
    return "\n".join(lines) + "\n"


def test_a_decode_fed_by_two_prefills_judges_each_pair_by_its_per_prefill_counters() -> None:
    watch = KvWatch(RULES)
    for p in ("p1", "p2"):
        watch.handover((p, "d"), tier="nvlink", expected_ms_per_byte=NVLINK, kv_bytes=1e9, transfer_ms=None, now=0.0)
    watch.scraped("d", nixl_totals(peer_text((0, 0, 0), (0, 0, 0))), 0.0)
    totals = nixl_totals(peer_text((0.16, 2, 2e9), (0.0044, 2, 2e9)))  # p1 at 12.5 GB/s, p2 at 450
    assert totals is not None and set(totals.peers) == {"p1", "p2"}
    watch.scraped("d", totals, 0.0)
    watch.scraped("d", nixl_totals(peer_text((0.32, 4, 4e9), (0.0088, 4, 4e9))), 11.0)
    verdicts = {row["pair"]: row["verdict"] for row in watch.view(11.0)["pairs"]}
    assert verdicts == {"p1->d": "wrong_path", "p2->d": "as_planned"}
