"""`python -m loadtest compare SCENARIO --mode live` as a user runs it: each of two policies deployed
with `serve deploy` on a Ray head of its own, the workload sent through the router, results for
both in results.jsonl with a report and plots, and nothing of it left running afterwards."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from loadtest.live.deploy import free_ports, port_in_use
from tests.conftest import ROOT
from wire.processes import session_pids

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.mark.timeout(1200)
def test_live_compare_deploys_each_policy_and_leaves_nothing_running(tmp_path: Path) -> None:
    scenario = yaml.safe_load((ROOT / "configs/scenarios/local-live.yaml").read_text())
    scenario.update(topology=str(ROOT / "configs/clusters/local-sim.yaml"), rates=[1])
    path = tmp_path / "local-live.yaml"
    path.write_text(yaml.safe_dump(scenario))
    out = tmp_path / "out"
    port = free_ports(1)[0]  # not 8000: other e2e tests want that one
    # 80-150 s on a quiet machine, 410 s once in CI (a deploy that never settled); a run past its
    # deadline is stopped as a user would (SIGTERM: the compare tears its deployment down) and
    # fails with what it printed
    with subprocess.Popen([sys.executable, "-m", "loadtest", "compare", str(path), "--mode", "live", "--out", str(out),
                           "--duration", "8", "--router-port", str(port)], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as run:
        try:
            _, stderr = run.communicate(timeout=840)
        except subprocess.TimeoutExpired:
            run.terminate()
            _, stderr = run.communicate(timeout=300)
            pytest.fail(f"loadtest compare --mode live did not end within 840 s: {stderr[-3000:]}")
    heads = [int(pid) for pid in re.findall(r"Ray head pid (\d+)", stderr)]
    leftovers = {pid: session_pids(pid) for pid in heads}
    assert run.returncode == 0, stderr[-3000:]
    assert len(heads) == 2, stderr  # a head of its own for each policy
    assert not any(leftovers.values()), f"processes left in our Ray sessions: {leftovers}"
    assert not port_in_use(port)

    rows = {r["policy"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert set(rows) == {"island-aligned", "ray-pack"}
    for r in rows.values():
        assert r["mode"] == "live" and r["summary"]["completed"] > 0
        assert r["summary"]["completed"] == r["summary"]["requests"], r["summary"]["outcomes"]
        assert r["topology_fingerprint"] and r["config"]["pools_from"] == "scenario"
        assert r["live"]["engine_virtual"]["tpot_ms"] > 0 and r["live"]["simulated"]["tpot_ms"] > 0
    # the plans came from the deployments: index order puts the TP=4 replica across the PCIe box
    assert rows["island-aligned"]["plan"]["crossing"] == [] and rows["ray-pack"]["plan"]["crossing"] == ["chat-0"]
    # The direction, on the engines' virtual clock (a few seconds of goodput on a shared 2-core machine is too
    # noisy to order two nearly equal policies): the replica ray-pack put across PCIe makes tokens slower.
    virtual = {p: r["live"]["engine_virtual"]["tpot_ms"] for p, r in rows.items()}
    assert virtual["ray-pack"] > virtual["island-aligned"], virtual

    report = (out / "report.md").read_text()
    assert "**Mode:** live" in report and "## Live against the simulator" in report and "ray-pack" in report
    for plot in ("goodput_vs_rate.png", "latency_by_tier.png", "slo_attainment.png"):
        assert (out / plot).stat().st_size > 0
