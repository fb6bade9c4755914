"""`python -m loadtest chaos` as an operator runs it, on a shortened timeline (`--scale 0.5`): the
local deployment on a Ray head plus three Ray nodes, 80 % load, a decode engine killed
mid-stream, an NVLink degraded, a Ray node lost, a 3x burst. What the run must show, read from
its chaos.json and requests.jsonl; and nothing of it left running afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loadtest.chaos.report import openai_error
from loadtest.live.deploy import RAY_ENV
from tests.conftest import ROOT
from wire.processes import session_pids

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], list[dict[str, Any]]]:
    out = tmp_path_factory.mktemp("chaos")
    done = subprocess.run([sys.executable, "-m", "loadtest", "chaos", "--out", str(out), "--scale", "0.5"], cwd=ROOT,
                          env={**os.environ, **RAY_ENV}, capture_output=True, text=True, timeout=840,
                          check=False)
    assert (out / "chaos.json").exists(), done.stderr[-3000:]
    report = json.loads((out / "chaos.json").read_text())
    requests = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    return done.returncode, report, requests


@pytest.mark.timeout(900)
def test_nothing_is_lost_hung_or_delivered_twice(run: tuple[int, dict[str, Any], list[dict[str, Any]]]) -> None:
    _, report, requests = run
    assert report["sent"] == len(requests) > 500
    assert (report["lost"], report["hung"], report["duplicated_tokens"]) == (0, 0, 0), report["lost_by_cause"]
    assert report["completed"] + report["errored"] == report["sent"]
    for r in requests:  # each answer as the client got it
        if r["verdict"] == "errored":
            assert openai_error(r["error"]) is not None, r
        else:
            assert r["verdict"] == "completed" and r["tokens"] == r["max_tokens"] == r["usage_tokens"], r


@pytest.mark.timeout(900)
def test_each_fault_shows_what_it_must(run: tuple[int, dict[str, Any], list[dict[str, Any]]]) -> None:
    _, report, _ = run
    faults = {f["kind"]: f for f in report["faults"]}
    assert set(faults) == {"replica_crash", "link_degrade", "node_loss", "overload"}
    assert all(f.get("recovered_s") is not None and not f.get("error") for f in faults.values()), faults
    crash = faults["replica_crash"]["details"]
    assert crash["failed_before_first_token"] == 0 and crash["stream_errors_without_tokens"] == 0
    lost = faults["node_loss"]
    assert lost["time_to_detect_s"] is not None and lost["time_to_replace_s"] is not None
    assert all(p["node"] != lost["node"] for p in lost["new_placements"].values()) and lost["new_placements"]
    assert lost["details"]["table_offers_lost_node_after_detection"] == 0
    assert lost["details"]["first_tokens_from_lost_node_after_kill"] == 0
    assert lost["details"]["served_by_replacements"] > 0
    link = faults["link_degrade"]
    assert link["new_placement"] and link["time_to_replace_s"] is not None and link["drained_s"] is not None
    shed = report["shedding"]
    assert shed["by_class"] and set(shed["by_class"]) <= set(shed["sheddable_classes"])
    assert shed["first"][0]["slo_class"] in shed["sheddable_classes"] and shed["without_retry_after"] == 0
    assert report["router_memory"]["samples"] > 10
    for name in ("crash_unstarted_requests_retried_elsewhere", "node_loss_replicas_replaced_and_not_routed_there",
                 "overload_sheds_sheddable_first_with_retry_after", "router_memory_bounded"):
        assert report["checks"][name], name


@pytest.mark.timeout(900)
def test_the_run_leaves_nothing_running(run: tuple[int, dict[str, Any], list[dict[str, Any]]]) -> None:
    _, report, _ = run
    sessions = report["deployment"]["sessions"]
    assert len(sessions) == 4  # the head and three Ray nodes
    assert all(session_pids(sid) == [] for sid in sessions)
    assert not Path(report["deployment"]["ray_temp_dir"]).exists()
