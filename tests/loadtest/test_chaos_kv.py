"""The chaos run's KV-path faults (issue 34), their pure parts: the spec and its errors, what the
decode engine is sent (checked against the engine's own fault parser), the router's verdict
history, the figures (detection, the pair's share, interactive TTFT p99 in the no-fault window,
during and after avoidance) and the checks."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from isleserve.planning import plan_for, resolve_topology
from isleserve.settings import app_args_from_serve_config
from loadtest.chaos.checks import checks
from loadtest.chaos.driver import ChaosRecord
from loadtest.chaos.faults import Observer
from loadtest.chaos.kvfaults import fault_body, lift_body
from loadtest.chaos.kvreport import (
    first_kv,
    kv_checks,
    kv_details,
    kv_progress,
    kv_summary,
    kv_windows,
    recorded,
    share_on_pair,
)
from loadtest.chaos.report import classified
from loadtest.chaos.spec import KvRemoteNic, KvTransportFallback, kv_pair_problems, load_chaos_spec
from simengine.kvfaults import KvFaults
from tests.conftest import ROOT
from tests.loadtest.test_chaos import CLASSES, TS, record
from topology.errors import ParseError

pytestmark = pytest.mark.unit
ROLES = {"prefill-0": "prefill", "prefill-1": "prefill", "decode-0": "decode", "decode-1": "decode"}


# the spec
def test_the_shipped_kv_spec_names_pairs_of_its_base_config() -> None:
    spec, base = load_chaos_spec(ROOT / "configs" / "chaos-kv.yaml")
    assert base == ROOT / "configs" / "pd-pairs.yaml" and spec.ray_nodes == []
    assert [f.kind for f in spec.faults] == ["kv_transport_fallback", "kv_remote_nic"]
    tcp, nic = spec.faults
    assert isinstance(tcp, KvTransportFallback) and tcp.pair == "prefill-0->decode-0" and tcp.duration_s is None
    assert isinstance(nic, KvRemoteNic) and nic.bandwidth_factor == 0.5
    args = app_args_from_serve_config(str(base))
    roles = {f"{p.name}-{i}": p.role for p in args.pools for i in range(int(p.replicas))}
    assert roles == ROLES and kv_pair_problems(spec.faults, roles) == []
    plan = plan_for(args, resolve_topology(args))  # four NVLink pairs: every replica on the head's node
    assert {p.node for p in plan.placements} == {spec.head_node} and not plan.unplaced


def test_scaling_keeps_the_routers_clock() -> None:
    spec, _ = load_chaos_spec(ROOT / "configs" / "chaos-kv.yaml")
    timed = spec.model_copy(update={"faults": [spec.faults[0].model_copy(update={"duration_s": 40.0})]})
    half = timed.scaled(0.5)
    fault = half.faults[0]
    assert isinstance(fault, KvTransportFallback)
    assert (fault.duration_s, fault.watch_s, half.window_s) == (20.0, 60.0, spec.window_s / 2)


@pytest.mark.parametrize(("fault", "message"), [
    ({"kind": "kv_transport_fallback", "decode": "decode-0", "prefill": "decode-0"}, "a pair is two replicas"),
    ({"kind": "kv_remote_nic", "decode": "decode-0", "prefill": "prefill-0", "bandwidth_factor": 1.0},
     "bandwidth_factor"),
    ({"kind": "kv_remote_nic", "decode": "decode-0"}, "prefill"),
    ({"kind": "kv_transport_fallback", "decode": "decode-0", "prefill": "prefill-0", "peer": "x"}, "peer"),
])
def test_a_bad_kv_fault_is_refused_with_its_path(tmp_path: Path, fault: dict[str, Any], message: str) -> None:
    path = tmp_path / "chaos.yaml"
    path.write_text(yaml.safe_dump({"faults": [{"kind": "overload"}, fault]}))
    with pytest.raises(ParseError, match=message) as err:
        load_chaos_spec(path)
    assert "faults[1]" in str(err.value)


def test_one_fault_per_pair(tmp_path: Path) -> None:
    path = tmp_path / "chaos.yaml"
    same = {"decode": "decode-0", "prefill": "prefill-0"}
    path.write_text(yaml.safe_dump({"faults": [{"kind": "kv_transport_fallback", **same},
                                               {"kind": "kv_remote_nic", **same}]}))
    with pytest.raises(ParseError, match="one fault per pair"):
        load_chaos_spec(path)


def test_pairs_must_be_replicas_of_the_base_config_every_problem_at_once() -> None:
    bad = [KvTransportFallback(kind="kv_transport_fallback", decode="prefill-1", prefill="prefill-9")]
    problems = kv_pair_problems(list(bad), ROLES)
    assert problems == ["faults[0] (kv_transport_fallback).decode: 'prefill-1' is not a decode replica of the base "
                        "config (its decode replicas: decode-0, decode-1)",
                        "faults[0] (kv_transport_fallback).prefill: 'prefill-9' is not a prefill replica of the base "
                        "config (its prefill replicas: prefill-0, prefill-1)"]


# what the engine is sent, read by the engine's own parser
def test_the_engine_faults_the_pair_only_and_the_lift_restores_it() -> None:
    tcp = KvTransportFallback(kind="kv_transport_fallback", decode="decode-0", prefill="prefill-0")
    nic = KvRemoteNic(kind="kv_remote_nic", decode="decode-0", prefill="prefill-1", bandwidth_factor=0.25)
    engine = KvFaults()
    for f in (tcp, nic):
        KvFaults.validate(fault_body(f))
        engine.apply(fault_body(f))
    assert engine.of("prefill-0", "127.0.0.1:1").path.transport == "tcp"
    assert engine.of("prefill-1", "127.0.0.1:2").path.bandwidth_factor == 0.25
    assert not engine.of("prefill-2", "127.0.0.1:3").path.active
    for f in (tcp, nic):
        engine.apply(lift_body(f))
    assert not engine.of("prefill-0", "").path.active and not engine.of("prefill-1", "").path.active


# the router's verdicts as the observer records them
def test_the_observer_records_each_change_of_verdict_or_avoidance() -> None:
    clock = [0.0]
    obs = Observer(admin=cast(Any, None), admin_key="", now=lambda: clock[0], router_port=0, in_flight=lambda: 0)

    def view(verdict: str, avoided: bool, ratio: float) -> dict[str, Any]:
        return {"pairs": [{"pair": "p->d", "verdict": verdict, "avoided": avoided, "bandwidth_ratio": ratio}]}

    for v in (view("as_planned", False, 1.0), view("as_planned", False, 0.9), view("wrong_path", False, 0.02),
              view("wrong_path", True, 0.02)):
        clock[0] += 1.0
        obs._kv(v)
    assert [c["at_s"] for c in obs.kv_changes] == [1.0, 3.0, 4.0]
    flagged = first_kv(obs.kv_changes, 2.0, "p->d", lambda r: r["verdict"] != "as_planned")
    assert flagged is not None and flagged[0] == 3.0 and flagged[1]["verdict"] == "wrong_path"
    assert first_kv(obs.kv_changes, 0.0, "q->d", lambda r: True) is None


# the figures and the checks
def _requests(after_ttft_s: float = 0.5, after_on_pair: int = 0) -> list[ChaosRecord]:
    """A run at 1 request a second: 60 s without a fault, the TCP fault at 60 s (its pair slow),
    the pair avoided at 80 s, then 60 s on the other pairs."""
    out = []
    pairs = [("prefill-0", "decode-0"), ("prefill-0", "decode-1"), ("prefill-1", "decode-0"), ("prefill-1", "decode-1")]
    for i in range(140):
        t = float(i)
        prefill, decode = pairs[i % 4]
        ttft = 0.5
        if t >= 80:
            prefill, decode = pairs[1 + i % 3]
            ttft = after_ttft_s
            if after_on_pair and i % 10 == 0:
                prefill, decode, after_on_pair = "prefill-0", "decode-0", after_on_pair - 1
        elif t >= 60 and (prefill, decode) == pairs[0]:
            ttft = 1.5
        out.append(record(i, sent_s=t, end_s=t + 0.9 + ttft, first_token_s=ttft, last_token_s=ttft + 0.3,
                          prefill_replica=prefill, replica=decode))
    return out


FAULT = {"kind": "kv_transport_fallback", "at_s": 60.0, "flagged_s": 71.5, "flag_verdict": "wrong_path",
         "avoided_s": 80.0, "recovered_s": 80.0, "watched_until_s": 80.0, "pair": "prefill-0->decode-0",
         "prefill": "prefill-0", "decode": "decode-0"}


def _fault(records: list[ChaosRecord], **update: Any) -> dict[str, Any]:
    fault = {**FAULT, **update}
    fault["details"] = kv_details(classified(records), fault, (0.0, 60.0), 60.0, CLASSES, TS)
    return fault


def test_kv_figures_read_detection_share_and_ttft_per_window() -> None:
    fault = _fault(_requests())
    d = fault["details"]
    assert (d["time_to_flag_s"], d["time_to_avoid_s"], d["time_to_leave_s"]) == (11.5, 20.0, 16.0)
    assert kv_windows(FAULT, (0.0, 60.0), 60.0) == {"no_fault": (0.0, 60.0), "during": (60.0, 80.0),
                                                    "after": (80.0, 140.0)}
    share = d["share_on_pair"]
    assert (share["no_fault"]["share"], share["during"]["share"], share["after"]["share"]) == (0.25, 0.25, 0.0)
    ttft = d["interactive"]
    assert ttft["no_fault"]["ttft_p99_ms"] == 100.0 and ttft["during"]["ttft_p99_ms"] == 300.0
    assert ttft["no_fault"]["requests"] == 59  # two were still running when the fault struck
    assert d["ttft_p99_ratio"] == 1.0
    assert d["ttft_on_pair"] == {"no_fault": {"requests": 15, "ttft_p50_ms": 100.0, "ttft_max_ms": 100.0},
                                 "during": {"requests": 5, "ttft_p50_ms": 300.0, "ttft_max_ms": 300.0}}
    assert all(kv_checks(fault).values()) and len(kv_checks(fault)) == 3
    assert "flagged after 11.5 s (wrong_path)" in kv_summary(fault) and "25% / 25% / 0%" in kv_summary(fault)


def test_each_kv_check_can_fail() -> None:
    late = kv_checks(_fault(_requests(), flagged_s=91.0))
    assert not late["kv_transport_fallback_flagged_within_30s"]
    never = kv_checks(_fault(_requests(), flagged_s=None, avoided_s=None, recovered_s=None, watched_until_s=120.0))
    assert not never["kv_transport_fallback_flagged_within_30s"]
    assert not never["kv_transport_fallback_traffic_moves_off_pair"]
    stays = kv_checks(_fault(_requests(after_on_pair=6)))  # 10 % of the PD requests
    assert not stays["kv_transport_fallback_traffic_moves_off_pair"]
    slow = kv_checks(_fault(_requests(after_ttft_s=0.56)))  # 12 % above the no-fault p99
    assert not slow["kv_transport_fallback_interactive_ttft_p99_recovers"]
    assert kv_checks(_fault(_requests(after_ttft_s=0.54)))["kv_transport_fallback_interactive_ttft_p99_recovers"]
    assert not any(kv_checks({**FAULT, "error": "decode-0 not in the router's table", "details": {}}).values())


def test_a_remote_nic_is_judged_once_the_router_flags_it() -> None:
    nic = _fault(_requests(), kind="kv_remote_nic", flagged_s=None, avoided_s=None, recovered_s=None)
    assert kv_checks(nic) == {}  # not flagged: reported, not judged
    flagged = kv_checks(_fault(_requests(after_ttft_s=0.56), kind="kv_remote_nic"))
    assert flagged == {"kv_remote_nic_flagged_within_30s": True, "kv_remote_nic_traffic_moves_off_pair": True,
                       "kv_remote_nic_interactive_ttft_p99_recovers": False}
    assert "flagged after None s" in kv_summary(nic)
    assert kv_progress(nic) == "the router did not flag prefill-0->decode-0"
    assert kv_progress(FAULT) == "the router flagged prefill-0->decode-0 at 72 s and avoided it at 80 s"


def test_the_runs_checks_include_the_kv_faults() -> None:
    report = {"lost": 0, "hung": 0, "duplicated_tokens": 0, "completed": 1, "errored": 0, "sent": 1,
              "faults": [_fault(_requests())], "router_memory": {"samples": 0}}
    found = checks(report, CLASSES)
    assert found["kv_transport_fallback_flagged_within_30s"] and found["lost_is_zero"]


def test_share_counts_pd_requests_only() -> None:
    records = classified([record(0, sent_s=1.0, prefill_replica="p", replica="d"), record(1, sent_s=2.0, replica="m"),
                          record(2, sent_s=3.0, prefill_replica="p", replica="e")])
    assert share_on_pair(records, "p", "d", 0.0, 10.0) == {"pd_requests": 2, "on_pair": 1, "share": 0.5}
    assert share_on_pair(records, "p", "d", 5.0, 10.0)["share"] is None


def test_a_reference_run_judges_the_same_window_with_the_same_requests() -> None:
    """A no-fault run of the same seed, read back from its requests.jsonl rows: the after window's
    p99 is set against the same window there, and the check follows that ratio."""
    rows = [{**dataclasses.asdict(r), "tokens": len(r.words), "verdict": v.bucket, "cause": v.cause, "duplicated": 0}
            for r, v in classified(_requests(after_ttft_s=0.5))]
    for row in rows:
        del row["words"]
    reference = recorded(rows)
    assert reference[0][0].prefill_replica == "prefill-0" and reference[0][1].bucket == "completed"
    slower_here = _fault(_requests(after_ttft_s=0.56))  # 12 % above both the no-fault window and the reference
    slower_here["details"] = kv_details(classified(_requests(after_ttft_s=0.56)), slower_here, (0.0, 60.0), 60.0,
                                        CLASSES, TS, reference)
    d = slower_here["details"]
    assert d["reference_after"]["ttft_p99_ms"] == 100.0 and d["ttft_p99_ratio_vs_reference"] == 1.12
    assert not kv_checks(slower_here)["kv_transport_fallback_interactive_ttft_p99_recovers"]
    assert "the same window in the reference run 100.0 ms, after / it 1.12" in kv_summary(slower_here)
    same = _fault(_requests())
    same["details"] = kv_details(classified(_requests()), same, (0.0, 60.0), 60.0, CLASSES, TS, reference)
    assert same["details"]["ttft_p99_ratio_vs_reference"] == 1.0 and all(kv_checks(same).values())
