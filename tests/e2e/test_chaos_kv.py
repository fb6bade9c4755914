"""Issue 34's proof of the path under load, as an operator runs it: `python -m loadtest chaos
--spec configs/chaos-kv.yaml` at full length (240 s windows: p99 over ~700 interactive requests
each, the 7th slowest; in 120 s it is the 4th slowest, and the same comparison read 0.97 to 1.21
on this machine), four NVLink PD pairs on a Ray head of its own at 60 % load; one pair's KV falls
back to TCP, then another's goes through a remote NIC. What a user notices, read from chaos.json
and requests.jsonl: the pair flagged within 30 s, its traffic gone elsewhere, interactive TTFT p99
back within 10 % of the no-fault run's, nothing lost or hung, and nothing left running.

The no-fault run is a reference run of the same spec and seed first (`--no-faults`, then
`--reference`): the same requests at the same times, so the two after windows differ by the fault
and the machine's noise alone. The faulted run's own quiet window is not a fair reference: its
requests are other ones (seed 7's clumps of long prompts move a window's p99 by 20-30 %,
`loadtest.chaos.kvreport`); two runs of 2026-12-05 read 1.09 and 1.27 against it. Both runs must
see the same machine: `make test` runs the chaos lane alone after the other lanes (beside them, one
CI run read 1.37; alone, 0.98)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loadtest.live.deploy import RAY_ENV
from tests.conftest import ROOT
from wire.processes import session_pids

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
Run = tuple[int, str, dict[str, Any], list[dict[str, Any]]]


REFERENCE_S = 300
"""How long the reference run goes on after its quiet window: past the end of the first fault's
after window (the fault at 300 s, avoided ~31 s later, then 240 s: ~571 s; the reference ends at 600 s)."""


def _chaos(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loadtest", "chaos", "--spec", "configs/chaos-kv.yaml", *args],
                          cwd=ROOT, env={**os.environ, **RAY_ENV}, capture_output=True, text=True, timeout=1500,
                          check=False)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    reference = tmp_path_factory.mktemp("chaos-kv-reference")
    done = _chaos("--no-faults", str(REFERENCE_S), "--out", str(reference))
    assert (reference / "requests.jsonl").exists(), done.stderr[-3000:]
    out = tmp_path_factory.mktemp("chaos-kv")
    done = _chaos("--reference", str(reference), "--out", str(out))
    assert (out / "chaos.json").exists(), done.stderr[-3000:]
    report = json.loads((out / "chaos.json").read_text())
    requests = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    return done.returncode, done.stderr, report, requests


@pytest.mark.timeout(3300)
def test_every_request_is_accounted_for(run: Run) -> None:
    _, _, report, requests = run
    assert report["sent"] == len(requests) > 500
    assert (report["lost"], report["hung"], report["duplicated_tokens"]) == (0, 0, 0), report["lost_by_cause"]
    assert report["completed"] + report["errored"] == report["sent"]
    assert all(r["prefill_replica"] for r in requests if r["verdict"] == "completed")  # every prompt split


@pytest.mark.timeout(3300)
def test_the_tcp_pair_is_flagged_avoided_and_ttft_recovers(run: Run) -> None:
    _, stderr, report, requests = run
    tcp = next(f for f in report["faults"] if f["kind"] == "kv_transport_fallback")
    d = tcp["details"]
    assert not tcp.get("error") and d["time_to_flag_s"] is not None and d["time_to_flag_s"] <= 30, tcp
    assert tcp["flag_verdict"] == "wrong_path" and d["time_to_avoid_s"] is not None
    share = d["share_on_pair"]
    assert share["no_fault"]["share"] > 0.1 and share["after"]["share"] <= 0.05, share
    ttft = d["interactive"]
    assert ttft["no_fault"]["requests"] >= 100 and ttft["after"]["requests"] >= 100, ttft
    assert d["reference_after"]["requests"] >= 100, d["reference_after"]
    assert d["ttft_p99_ratio_vs_reference"] <= 1.10, (d["ttft_p99_ratio_vs_reference"], ttft, d["reference_after"])
    row = tcp["router_row_at_end_of_watch"]  # the router measured TCP speed on an NVLink pair
    assert row["verdict"] == "wrong_path" and row["bandwidth_ratio"] < 0.1, row
    # the requests say the same: the pair served none sent in the after window but the router's probes
    start, end = ttft["after"]["from_s"], ttft["after"]["to_s"]
    on_pair = [r for r in requests if start <= r["sent_s"] < end
               and (r["prefill_replica"], r["replica"]) == (tcp["prefill"], tcp["decode"])]
    assert len(on_pair) <= 2, on_pair
    for name in ("kv_transport_fallback_flagged_within_30s", "kv_transport_fallback_traffic_moves_off_pair",
                 "kv_transport_fallback_interactive_ttft_p99_recovers", "lost_is_zero", "hung_is_zero"):
        assert report["checks"][name], name
    assert "kv_transport_fallback prefill-0->decode-0: flagged after" in stderr


@pytest.mark.timeout(3300)
def test_the_remote_nic_is_reported(run: Run) -> None:
    rc, _, report, _ = run
    nic = next(f for f in report["faults"] if f["kind"] == "kv_remote_nic")
    assert not nic.get("error") and nic["engine_fault"] == {"kv_peer": "prefill-1", "kv_bandwidth_factor": 0.5}
    assert "time_to_flag_s" in nic["details"] and nic["details"]["ttft_p99_ratio"] is not None
    assert rc == (0 if report["passed"] else 1)


@pytest.mark.timeout(3300)
def test_the_run_leaves_nothing_running(run: Run) -> None:
    _, _, report, _ = run
    sessions = report["deployment"]["sessions"]
    assert len(sessions) == 1  # the head alone carries the four replicas
    assert all(session_pids(sid) == [] for sid in sessions)
    assert not Path(report["deployment"]["ray_temp_dir"]).exists()
