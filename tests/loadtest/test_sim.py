"""The offline simulator: the product's policies, router decisions and batching core on a virtual
clock. Checks what a user of `python -m loadtest compare` relies on."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from loadtest.compare import compare
from loadtest.model import TraceRequest
from loadtest.scenario import load_scenario
from loadtest.sim.cluster import simulate
from loadtest.sim.model import Fault, SimConfig, SimResult
from loadtest.sim.network import Network
from pools.model import PlacementRequest, PoolSpec
from pools.placement import get_policy
from tests.conftest import ROOT
from tests.loadtest.conftest import CLASSES, POOLS, config, workload
from topology import read_source

pytestmark = pytest.mark.sim

def by_index(result: SimResult) -> dict[int, tuple[object, ...]]:
    return {r.index: (r.outcome, r.replica, r.prefill_replica, round(r.ttft_s or 0, 9), round(r.e2e_s or 0, 9))
            for r in result.results}


def test_every_request_completes_with_timings_and_tiers() -> None:
    result = simulate(config(), workload())
    assert len(result.results) == 300 and all(r.ok for r in result.results)
    assert all(r.ttft_s is not None and 0 < r.ttft_s <= r.e2e_s for r in result.results if r.e2e_s is not None)
    pd = [r for r in result.results if r.prefill_replica]
    assert pd and all(r.prompt_tokens >= 256 and r.replica.startswith("decode") for r in pd)
    assert {r.tier for r in result.results} <= {"nvlink", "numa", "pcie", "local", "rdma", "tcp"}


def test_fast_forward_changes_nothing_but_speed() -> None:
    wl = workload(200, rate=20.0)
    fast, slow = simulate(config(), wl), simulate(config(fast_forward=False), wl)
    assert by_index(fast) == by_index(slow)
    assert fast.events < slow.events


def test_the_same_seed_gives_the_same_run() -> None:
    assert by_index(simulate(config(), workload())) == by_index(simulate(config(), workload()))


def test_a_lost_node_loses_no_request_that_had_not_streamed() -> None:
    pools = (*POOLS[:2], replace(POOLS[2], replicas=4))  # the mixed pool spills onto a second node
    cfg = config(pools=pools, faults=(Fault(at_s=5.0, kind="node_loss", node="h100-0"),))
    assert {p.node for p in cfg.plan.placements} == {"h100-0", "h100-1"}
    result = simulate(cfg, workload(300, rate=20.0))
    assert len(result.results) == 300
    outcomes = {r.outcome for r in result.results}
    assert outcomes <= {"ok", "error:502 replica lost mid-stream"}
    lost = [e for e in result.log if e["event"] == "replica_lost"]
    assert lost and all(r.replica not in {e["replica"] for e in lost} for r in result.results
                        if r.ok and r.sent_s > 5.0)  # nothing new goes to the lost node


def test_a_degraded_link_drains_its_replica_for_interactive_traffic() -> None:
    target = next(p for p in config().plan.placements if p.role == "mixed")
    fault = Fault(at_s=3.0, kind="link_degrade", node=target.node, gpus=target.gpus[:2], factor=0.1)
    result = simulate(config(faults=(fault,), detect_s=1.0, pd_enabled=False), workload(400, rate=20.0))
    drained = [e for e in result.log if e["event"] == "drain"]
    assert drained and drained[0]["replica"] == target.replica_id and drained[0]["t"] == pytest.approx(4.0)
    late_interactive = [r for r in result.results if r.slo_class == "interactive" and r.sent_s > 4.0]
    assert late_interactive and all(r.replica != target.replica_id for r in late_interactive)


def test_a_prefill_replica_full_of_held_kv_resumes_when_the_decode_side_takes_it() -> None:
    topology = read_source(str(ROOT / "configs/clusters/low-affinity-pd.yaml"))  # KV crawls over 25 Gb/s
    pools = (PoolSpec(name="prefill", role="prefill", tp=1, replicas=1, model="llama-3.1-8b"),
             PoolSpec(name="decode", role="decode", tp=1, replicas=1, model="llama-3.1-8b"))
    plan = get_policy("spread").place(PlacementRequest(topology=topology, pools=pools, slo_classes=CLASSES))
    assert len({p.node for p in plan.placements}) == 2  # prefill and decode on different nodes
    wl = [TraceRequest(index=i, arrival_s=i * 0.01, prompt_tokens=1500, output_tokens=8, slo_class="standard")
          for i in range(40)]
    result = simulate(SimConfig(topology=topology, plan=plan, classes=CLASSES, kv_capacity_tokens=4096,
                                pd_min_prompt_tokens=0), wl)
    assert [r.outcome for r in result.results] == ["ok"] * 40  # none stuck behind the held KV


def test_transfers_on_one_nic_share_it() -> None:
    net = Network()
    net.start(0.0, 1, [(10.0, ("a:send", "b:recv"), 10.0)])
    assert net.next_done() == pytest.approx(1.0)  # alone: 10 GB at 10 GB/s
    net.start(0.0, 2, [(10.0, ("a:send", "c:recv"), 10.0)])
    assert net.next_done() == pytest.approx(2.0)  # two flows share a:send
    assert net.finish_due(2.0) == [1, 2]


def test_compare_writes_results_report_and_plots(tmp_path: Path) -> None:
    text = (ROOT / "configs/scenarios/pcie-pairs.yaml").read_text()
    scenario_file = tmp_path / "small.yaml"
    scenario_file.write_text(text.replace("../../topology/templates/h100-nvl-pairs.yaml", "h100-nvl-pairs")
                             .replace("duration_s: 120", "duration_s: 20").replace("rates: [2, 4, 6, 8]", "rates: [6]"))
    scenario = load_scenario(scenario_file, ["island-aligned", "ray-pack"])
    rows = compare(scenario, tmp_path / "out", progress=False)
    lines = [json.loads(x) for x in (tmp_path / "out/results.jsonl").read_text().splitlines()]
    assert [r["policy"] for r in lines] == ["island-aligned", "ray-pack"] and len(rows) == 2
    for r in lines:
        assert {"policy", "routing", "rate_rps", "goodput_rps", "slo_attainment", "topology_fingerprint", "plan",
                "summary"} <= set(r)
        assert set(r["summary"]["per_tier"]) and r["summary"]["ttft_ms"]["p99"] > 0
    report = (tmp_path / "out/report.md").read_text()
    assert "## Verdict" in report and "island-aligned" in report and "ray-pack put" in report
    for png in ("goodput_vs_rate.png", "latency_by_tier.png", "slo_attainment.png"):
        assert (tmp_path / "out" / png).stat().st_size > 10_000


@pytest.mark.parametrize("name", ["pcie-pairs", "low-affinity-pd"])
def test_island_aligned_gives_half_again_the_goodput_of_ray_pack(name: str) -> None:
    scenario = load_scenario(ROOT / f"configs/scenarios/{name}.yaml", ["island-aligned", "ray-pack"])
    top = max(scenario.config.rates)
    from loadtest.compare import run_one, workload_for

    wl = workload_for(scenario, top)
    ours, theirs = run_one(scenario, "island-aligned", top, wl), run_one(scenario, "ray-pack", top, wl)
    assert ours["goodput_rps"] >= 1.5 * theirs["goodput_rps"]


def test_sizing_candidates_are_checked_in_the_simulator(capsys: pytest.CaptureFixture[str]) -> None:
    from loadtest.refine import main

    assert main(["--topology", "hgx-h100", "--model", "llama-3.1-8b", "--workload", "azure-conv", "--slo",
                 "interactive", "--refine", "--duration", "5", "--candidates", "2", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["candidates"]) == 2
    best = out["best"]
    assert best["simulated_goodput_per_gpu"] == max(c["simulated_goodput_per_gpu"] for c in out["candidates"])
    assert 0.5 * best["estimated_goodput_rps"] < best["simulated_goodput_rps"] and best["slo_attainment"] > 0.9


def test_sim_command_prints_the_summary(capsys: pytest.CaptureFixture[str]) -> None:
    from loadtest.simulate import main

    assert main([str(ROOT / "configs/scenarios/pcie-pairs.yaml"), "--policy", "ray-pack", "--rate", "1"]) == 0
    out = capsys.readouterr().out
    assert "pcie-pairs: ray-pack at x1" in out and "Successful requests:" in out and "P99 TTFT (ms):" in out
    assert main(["/nonexistent.yaml"]) == 2


def test_isle_size_refine_goes_to_the_simulator(capsys: pytest.CaptureFixture[str]) -> None:
    import isle

    assert isle.main(["size", "--topology", "hgx-h100", "--model", "llama-3.1-8b", "--workload", "azure-conv",
                      "--slo", "interactive", "--refine", "--duration", "3", "--candidates", "1",
                      "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["best"]["simulated_goodput_rps"] > 0
