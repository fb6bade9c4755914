"""The chaos run's pure parts: its spec, its requests and their expected words, the accounting of
every request, the fault windows, the checks, the capacity search; and the small probes it uses."""

from __future__ import annotations

import socket
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from loadtest.chaos.capacity import ATTAINMENT, search
from loadtest.chaos.checks import checks, crash_details, node_loss_details
from loadtest.chaos.cluster import (
    HEAD_RESOURCE,
    ROUTER_DEPLOYMENT,
    chaos_args,
    listening_pid,
    rss_mb,
    write_serve_config,
)
from loadtest.chaos.driver import ChaosRecord, _Sse
from loadtest.chaos.load import RequestFactory, duplicated_tokens, expected_words
from loadtest.chaos.report import ERRORED, HUNG, LOST, classified, classify, fault_windows, memory, shedding, totals
from loadtest.chaos.spec import ChaosSpec, LinkDegrade, Overload, WorkloadShape, load_chaos_spec
from pools.model import SLOClass
from tests.conftest import ROOT
from topology.errors import ParseError
from wire.text import TokenText

pytestmark = pytest.mark.unit
CLASSES = {"interactive": SLOClass(name="interactive", priority=0, ttft_ms=500, tpot_ms=50),
           "standard": SLOClass(name="standard", priority=1, ttft_ms=2000, tpot_ms=100),
           "batch": SLOClass(name="batch", priority=2, ttft_ms=30000, tpot_ms=500, sheddable=True)}
TS = 5.0  # time scale: wall seconds per modelled second


def record(index: int = 0, *, seed: int = 11, n: int = 4, sent_s: float = 1.0, words: list[str] | None = None,
           **kw: Any) -> ChaosRecord:
    got = expected_words(seed, n) if words is None else words
    fields: dict[str, Any] = {"status": 200, "done": True, "usage_tokens": n, "end_s": sent_s + 2.0,
                              "first_token_s": 0.5, "last_token_s": 0.8}
    fields.update(kw)
    return ChaosRecord(index=index, slo_class=fields.pop("slo_class", "interactive"), seed=seed, max_tokens=n,
                       sent_s=sent_s, words=tuple(got), **fields)


def openai_error(status: int, kind: str) -> dict[str, Any]:
    return {"error": {"message": f"{status} happened", "type": kind, "code": status}}


# the spec
def test_the_shipped_spec_loads_and_names_the_local_config() -> None:
    spec, base = load_chaos_spec(ROOT / "configs" / "chaos.yaml")
    assert base == ROOT / "configs" / "local.yaml" and spec.load == 0.8
    assert [f.kind for f in spec.faults] == ["replica_crash", "link_degrade", "node_loss", "overload"]
    overload = spec.faults[-1]
    assert isinstance(overload, Overload) and overload.factor == 3


def test_a_node_that_no_ray_node_of_its_own_carries_cannot_be_lost(tmp_path: Path) -> None:
    path = tmp_path / "chaos.yaml"
    path.write_text(yaml.safe_dump({"head_node": "h100-0", "ray_nodes": ["pcie-box"],
                                    "faults": [{"kind": "node_loss", "node": "h100-0"}, {"kind": "meteor"}]}))
    with pytest.raises(ParseError) as err:
        load_chaos_spec(path)
    assert "faults[1]" in str(err.value) and "meteor" in str(err.value)
    path.write_text(yaml.safe_dump({"head_node": "h100-0", "ray_nodes": ["pcie-box"],
                                    "faults": [{"kind": "node_loss", "node": "h100-0"}]}))
    with pytest.raises(ParseError, match="node_loss h100-0: only a node in ray_nodes"):
        load_chaos_spec(path)


def test_scaling_shortens_windows_and_durations_but_not_what_ray_decides() -> None:
    spec, _ = load_chaos_spec(ROOT / "configs" / "chaos.yaml")
    half = spec.scaled(0.5)
    assert half.window_s == spec.window_s / 2
    link = next(f for f in half.faults if isinstance(f, LinkDegrade))
    burst = next(f for f in half.faults if isinstance(f, Overload))
    assert link.detect_after_s == 2.5 and burst.duration_s == 5 and half.recover_timeout_s == spec.recover_timeout_s


# requests and their words
def test_requests_are_a_function_of_seed_and_index() -> None:
    shape = WorkloadShape(prompt="uniform:100:900", output="uniform:8:32", seed=3)
    a, b = RequestFactory(shape), RequestFactory(shape)
    assert [a.make(i) for i in (5, 1, 9)] == [b.make(i) for i in (5, 1, 9)]
    mix = Counter(a.make(i).slo_class for i in range(3000))
    assert abs(mix["interactive"] / 3000 - 0.3) < 0.03 and abs(mix["batch"] / 3000 - 0.3) < 0.03
    assert all(8 <= a.make(i).max_tokens <= 32 for i in range(200))


def test_expected_words_are_the_engines_words() -> None:
    text = TokenText(1234)
    assert expected_words(1234, 6) == [text.next().strip() for _ in range(6)]


@pytest.mark.parametrize(("received", "duplicated"), [
    (["a", "b", "c"], 0), (["a", "b"], 0), ([], 0),
    (["a", "b", "a", "b", "c"], 3),  # a retry after the first token starts the words over
    (["a", "b", "c", "d"], 1),  # more than asked for
    (["a", "x", "c"], 2),  # a wrong word, and everything after it
])
def test_duplicated_tokens_count_what_came_after_the_order_broke(received: list[str], duplicated: int) -> None:
    assert duplicated_tokens(received, ["a", "b", "c"]) == duplicated


def test_sse_events_are_read_across_reads() -> None:
    sse = _Sse()
    for piece in (b'data: {"choices": [{"delta": {"content": " the"}}]}\n\ndata: {"choi', b'ces": [{"delta": {"con',
                  b'tent": " cache"}}]}\n\ndata: {"choices": [], "usage": {"completion_tokens": 2}}\n\n',
                  b"data: [DONE]\n\n"):
        sse.feed(piece, 1.0)
    assert sse.words == ["the", "cache"] and sse.usage == 2 and sse.done and sse.error is None
    cut = _Sse()
    cut.feed(b'data: {"error": {"message": "upstream replica failed mid-stream", "type": "server_error"}}\n\n', 2.0)
    assert cut.error["error"]["type"] == "server_error" and not cut.done


# the accounting
def test_each_request_lands_in_exactly_one_bucket() -> None:
    assert classify(record()).bucket == "completed"
    shed = classify(record(status=429, error=openai_error(429, "rate_limit_error"), done=False, words=[]))
    assert (shed.bucket, shed.cause) == (ERRORED, "http 429 rate_limit_error")
    cut = classify(record(words=expected_words(11, 2), done=False,
                          error={"error": {"message": "mid-stream", "type": "server_error", "code": 502}}))
    assert (cut.bucket, cut.cause, cut.tokens) == (ERRORED, "stream 502 server_error", 2)
    assert classify(record(status=502, error={"unparseable_body": "<html>"}, words=[])).bucket == LOST
    assert classify(record(done=False)).bucket == LOST  # ended without [DONE] or an error
    assert classify(record(transport_error="ConnectionResetError: closed mid-body")).bucket == LOST
    assert classify(record(timed_out=True, end_s=None, done=False)).bucket == HUNG
    assert classify(record(words=expected_words(11, 3))).bucket == LOST  # a word missing
    replay = classify(record(words=[*expected_words(11, 2), *expected_words(11, 2)]))
    assert (replay.bucket, replay.duplicated) == (LOST, 2)
    wrong_usage = classify(record(usage_tokens=5))
    assert wrong_usage.bucket == LOST


def test_totals_and_shedding() -> None:
    pairs = classified([
        record(0), record(1, slo_class="batch", status=429, retry_after="1", done=False, words=[], sent_s=3.0,
                          error=openai_error(429, "rate_limit_error")),
        record(2, slo_class="standard", status=429, done=False, words=[], sent_s=4.0,
               error=openai_error(429, "rate_limit_error")),
        record(3, timed_out=True, end_s=None, done=False)])
    t = totals(pairs)
    assert (t["sent"], t["completed"], t["errored"], t["lost"], t["hung"]) == (4, 1, 2, 0, 1)
    assert t["errored_by_cause"] == {"http 429 rate_limit_error": 2}
    shed = shedding(pairs, CLASSES)
    assert shed["by_class"] == {"batch": 1, "standard": 1} and shed["first"][0]["slo_class"] == "batch"
    assert shed["without_retry_after"] == 1 and shed["first_non_sheddable_s"] == 4.0


def test_fault_windows_put_requests_in_flight_at_the_fault_in_during() -> None:
    fast: dict[str, Any] = {"first_token_s": 0.5, "last_token_s": 1.0}  # modelled TTFT 100 ms
    slow: dict[str, Any] = {"first_token_s": 5.0, "last_token_s": 6.0}  # 1000 ms: misses the 500 ms target
    pairs = classified([
        record(0, sent_s=1.0, end_s=3.0, **fast),  # before, over before the fault
        record(1, sent_s=8.0, end_s=12.0, **fast),  # in flight at 10: during
        record(2, sent_s=11.0, end_s=17.0, **slow),  # during
        record(3, sent_s=21.0, end_s=22.0, **fast),  # after recovery at 20
        record(4, sent_s=2.0, end_s=3.0, slo_class="standard", **slow)])  # another class
    w = fault_windows(pairs, {"at_s": 10.0, "recovered_s": 20.0}, 10.0, CLASSES, TS)
    assert [w[k]["requests"] for k in ("before", "during", "after")] == [1, 2, 1]
    assert w["during"]["slo_attainment"] == 0.5 and w["after"]["slo_attainment"] == 1.0
    assert w["during"]["ttft_p99_ms"] == pytest.approx(991.0)
    never = fault_windows(pairs, {"at_s": 10.0, "recovered_s": None}, 10.0, CLASSES, TS)
    assert "after" not in never and never["during"]["to_s"] == 20.0


def test_crash_details_tell_retried_from_cut_streams() -> None:
    cut = {"error": {"message": "upstream replica failed mid-stream", "type": "server_error", "code": 502}}
    pairs = classified([
        record(0, sent_s=9.0, replica="mixed-0", words=expected_words(11, 2), done=False, error=cut),
        record(1, sent_s=9.5, replica="mixed-1"),  # queued on mixed-0, retried there
        record(2, sent_s=10.5, status=502, replica="", words=[], done=False, end_s=11.0,
               error=openai_error(502, "bad_gateway"))])
    d = crash_details(pairs, {"at_s": 10.0, "recovered_s": 12.0, "replica": "mixed-0"}, 5.0)
    assert d["stream_errors"] == 1 and d["stream_errors_without_tokens"] == 0
    assert d["failed_before_first_token"] == 1


def test_node_loss_details_read_the_table_history_and_first_tokens() -> None:
    fault = {"at_s": 10.0, "detected_s": 25.0, "controller_replaced_s": 27.0, "recovered_s": 27.5, "node": "pcie-box",
             "replicas": ["mixed-1"]}
    changes = [{"at_s": 25.0, "replicas": {"mixed-1": {"node": "pcie-box", "healthy": False, "draining": True}}},
               {"at_s": 27.5, "replicas": {"mixed-1": {"node": "h100-0", "healthy": True, "draining": False}}}]
    pairs = classified([record(0, sent_s=9.0, replica="mixed-1", first_token_s=0.2),
                        record(1, sent_s=28.0, replica="mixed-1")])
    d = node_loss_details(pairs, fault, changes)
    assert d == {"table_offers_lost_node_after_detection": 0, "first_tokens_from_lost_node_after_kill": 0,
                 "served_by_replacements": 1}
    bad = [*changes, {"at_s": 30.0, "replicas": {"mixed-1": {"node": "pcie-box", "healthy": True,
                                                              "draining": False}}}]
    assert node_loss_details(pairs, fault, bad)["table_offers_lost_node_after_detection"] == 1


def test_node_loss_judges_each_lost_replica_up_to_its_own_replacement() -> None:
    """Two replicas lost with one node, replaced 10 s apart: the first replacement's tokens (same
    replica id, another node) are not tokens from the dead node; a token before a replica's own
    replacement is."""
    fault = {"at_s": 10.0, "detected_s": 25.0, "controller_replaced_s": 37.0, "node": "pcie-box",
             "replicas": ["mixed-1", "decode-0"], "replaced_s_by_replica": {"mixed-1": 27.0, "decode-0": 37.0}}
    pairs = classified([record(0, sent_s=30.0, replica="mixed-1", first_token_s=0.2),
                        record(1, sent_s=20.0, replica="decode-0", first_token_s=0.2)])
    d = node_loss_details(pairs, fault, [])
    assert d["first_tokens_from_lost_node_after_kill"] == 1 and d["served_by_replacements"] == 1


def test_memory_keeps_a_short_series() -> None:
    samples = [(float(t), 200.0 + (t % 7), t % 50) for t in range(600)]
    m = memory(samples, load_end_s=500.0)
    assert m["samples"] == 600 and m["peak_mb"] == 206.0 and len(m["series"]) <= 121
    assert memory([], 1.0) == {"samples": 0}


def _report(**overrides: Any) -> dict[str, Any]:
    report: dict[str, Any] = {
        "sent": 10, "completed": 8, "errored": 2, "lost": 0, "hung": 0, "duplicated_tokens": 0,
        "shedding": {"first": [{"slo_class": "batch"}], "without_retry_after": 0, "sheddable_classes": ["batch"]},
        "router_memory": {"samples": 5, "early_max_mb": 200.0, "after_load_mb": 230.0},
        "faults": [{"kind": "overload", "recovered_s": 5.0,
                    "details": {"shed_by_class": {"batch": 2}, "slo_attainment": {"interactive": 0.97}}},
                   {"kind": "link_degrade", "recovered_s": 9.0, "interactive": {"after": {"ttft_p99_ms": 180.0}}}]}
    report.update(overrides)
    return report


def test_checks_pass_and_each_can_fail() -> None:
    assert all(checks(_report(), CLASSES).values())
    assert not checks(_report(lost=1, completed=7), CLASSES)["lost_is_zero"]
    assert not checks(_report(hung=1), CLASSES)["hung_is_zero"]
    assert not checks(_report(duplicated_tokens=3), CLASSES)["duplicated_tokens_is_zero"]
    first_standard = _report(shedding={"first": [{"slo_class": "standard"}], "without_retry_after": 0,
                                       "sheddable_classes": ["batch"]})
    assert not checks(first_standard, CLASSES)["overload_sheds_sheddable_first_with_retry_after"]
    slow = _report()
    slow["faults"][1]["interactive"]["after"]["ttft_p99_ms"] = 900.0
    assert not checks(slow, CLASSES)["link_degrade_interactive_ttft_recovers_after_drain"]
    leak = _report(router_memory={"samples": 5, "early_max_mb": 200.0, "after_load_mb": 900.0})
    assert not checks(leak, CLASSES)["router_memory_bounded"]


# capacity
def test_capacity_search_finds_the_edge_of_a_step() -> None:
    found = search(lambda rate: 1.0 if rate <= 100 else 0.5)
    assert 90 <= found.rps <= 100 and found.probes[0] == (8.0, 1.0)
    assert all(a >= ATTAINMENT for r, a in found.probes if r <= found.rps)
    assert search(lambda rate: 0.0).rps == 0.0


# the deployment's configuration and probes
def test_the_chaos_deployment_keeps_the_router_on_the_head(tmp_path: Path) -> None:
    spec = ChaosSpec.model_validate({"time_scale": 4, "faults": [{"kind": "overload"}]})
    doc, index, args = chaos_args(spec, ROOT / "configs" / "local.yaml", tmp_path / "state", 8123)
    assert args.time_scale == 4 and args.state_dir == str(tmp_path / "state") and args.router.port == 8123
    assert Path(args.topology).is_absolute() and Path(args.topology).exists()
    written = yaml.safe_load(write_serve_config(doc, index, args, tmp_path / "serve.yaml").read_text())
    app = written["applications"][index]
    assert app["deployments"] == [{"name": ROUTER_DEPLOYMENT, "ray_actor_options": {
        "num_cpus": 0, "resources": {HEAD_RESOURCE: 0.001}}}]
    assert app["args"]["router"]["host"] == "127.0.0.1"


def test_the_process_listening_on_a_port_and_its_memory() -> None:
    import os

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert listening_pid(s.getsockname()[1]) == os.getpid()
    rss = rss_mb(os.getpid())
    assert rss is not None and rss > 1
