"""Live against simulated, on the engines' virtual clock: the plan's engines and the router as real
processes on loopback (no Ray), a short workload through the router, and the simulator on the
same plan and the same requests. Plus the pieces (engine histograms, the sent workload, the live
configuration) as plain unit tests."""

from __future__ import annotations

import math
import urllib.request
from collections.abc import Mapping
from pathlib import Path

import pytest

import loadtest.calibrate as calibrate_module
from loadtest.calibrate import DEFAULT_SCENARIO, calibrate
from loadtest.live.compare import (
    LiveOptions,
    base_serve_config,
    live_args,
    live_workload,
    local_misfit,
    plan_summary_json,
)
from loadtest.live.timings import as_sent, engine_counters, engine_timings, mean_timings, modelled
from loadtest.model import RequestResult, TraceRequest
from loadtest.scenario import load_scenario
from tests.conftest import ROOT

pytestmark = [pytest.mark.unit, pytest.mark.serial]

LOCAL = ROOT / "configs" / "local.yaml"
PD_SCENARIO = f"""
name: local-pd
topology: {ROOT / "configs" / "clusters" / "local-sim.yaml"}
pools:
  - {{name: prefill, role: prefill, tp: 2, replicas: 1, model: llama-3.1-8b}}
  - {{name: decode, role: decode, tp: 2, replicas: 1, model: llama-3.1-8b}}
  - {{name: mixed, role: mixed, tp: 1, replicas: 1, model: llama-3.1-8b}}
workload: {{trace: azure-conv, duration_s: 30}}
policies: [island-aligned]
routing:
  pd: {{enabled: true, min_prompt_tokens: 600}}
"""


def _result(index: int, ttft_s: float, e2e_s: float, tokens: int, sent_s: float = 0.0, outcome: str = "ok",
            prompt: int = 100) -> RequestResult:
    ok = outcome == "ok"
    return RequestResult(index=index, slo_class="standard", sent_s=sent_s, outcome=outcome, prompt_tokens=prompt,
                         output_tokens=tokens, ttft_s=ttft_s if ok else None, e2e_s=e2e_s if ok else None,
                         tpot_s=(e2e_s - ttft_s) / (tokens - 1) if ok and tokens > 1 else None)


@pytest.mark.unit
def test_engine_timings_add_prefill_and_decode_first_tokens() -> None:
    before = {"m": {"time_to_first_token_seconds_sum": 1.0, "time_to_first_token_seconds_count": 10}}
    after = {
        "m": {"time_to_first_token_seconds_sum": 1.2, "time_to_first_token_seconds_count": 12,
              "inter_token_latency_seconds_sum": 0.3, "inter_token_latency_seconds_count": 100},
        "p": {"time_to_first_token_seconds_sum": 0.1, "time_to_first_token_seconds_count": 2},
        "d": {"time_to_first_token_seconds_sum": 0.02, "time_to_first_token_seconds_count": 2,
              "inter_token_latency_seconds_sum": 0.1, "inter_token_latency_seconds_count": 100},
    }
    got = engine_timings(before, after, {"m": "mixed", "p": "prefill", "d": "decode"})
    # 2 mixed first tokens (0.2 s) + 2 PD requests (prefill 0.1 s + decode 0.02 s) over 4 requests
    assert got["requests"] == 4 and got["ttft_ms"] == pytest.approx(320 / 4)
    assert got["tpot_ms"] == pytest.approx(0.4 * 1000 / 200) and got["token_gaps"] == 200
    assert math.isnan(engine_timings({}, {"m": {}}, {"m": "mixed"})["ttft_ms"])


@pytest.mark.unit
def test_mean_timings_weigh_tpot_by_token_gap_and_skip_failures() -> None:
    results = [_result(0, 0.010, 0.110, 11), _result(1, 0.030, 0.330, 101), _result(2, 9, 9, 5, outcome="shed")]
    got = mean_timings(results)
    assert got["ttft_ms"] == pytest.approx(20.0)
    assert got["tpot_ms"] == pytest.approx((0.1 + 0.3) * 1000 / 110)


@pytest.mark.unit
def test_the_simulator_gets_what_was_sent_on_the_engines_clock() -> None:
    asked = [TraceRequest(index=i, arrival_s=i * 0.5, prompt_tokens=500, output_tokens=8, prefix_blocks=(i,))
             for i in range(3)]
    sent = [_result(2, 0.01, 0.05, 8, sent_s=0.26, prompt=517), _result(0, 0.01, 0.05, 8, sent_s=0.01, prompt=509),
            _result(1, 0.01, 0.05, 0, sent_s=0.13, outcome="error:503")]
    got = as_sent(sent, asked, time_scale=0.25)
    assert [r.index for r in got] == [0, 1, 2]
    assert [r.arrival_s for r in got] == pytest.approx([0.04, 0.52, 1.04])
    assert [r.prompt_tokens for r in got] == [509, 500, 517]  # the engine's count; asked for when it failed
    assert [r.output_tokens for r in got] == [8, 8, 8] and got[2].prefix_blocks == (2,)
    scaled = modelled(sent, 0.25)[0]
    assert scaled.sent_s == pytest.approx(1.04) and scaled.ttft_s == pytest.approx(0.04)


@pytest.mark.unit
def test_live_configuration_takes_policy_pools_classes_and_routing(tmp_path: Path) -> None:
    doc, index, base = base_serve_config(LOCAL)
    assert doc["applications"][index]["import_path"] == "isleserve.app:build"
    scenario = load_scenario(DEFAULT_SCENARIO)
    assert local_misfit(scenario, base) is None
    args = live_args(base, scenario, "ray-pack", True, LiveOptions(router_port=18123), tmp_path / "state")
    assert args.policy == "ray-pack" and args.router.port == 18123 and args.router.host == "127.0.0.1"
    assert [p.name for p in args.pools] == [p.name for p in scenario.config.pools]
    assert args.router.classes()["interactive"].tpot_ms == 6 and not args.router.pd.enabled
    assert args.state_dir == str(tmp_path / "state") and Path(args.topology).is_absolute()
    kept = live_args(base, scenario, "spread", False, LiveOptions(), tmp_path)
    assert [p.name for p in kept.pools] == ["prefill", "decode", "mixed"]  # local.yaml's


@pytest.mark.unit
def test_a_scenario_on_another_cluster_keeps_the_local_pools() -> None:
    _, _, base = base_serve_config(LOCAL)
    why = local_misfit(load_scenario(ROOT / "configs" / "scenarios" / "pcie-pairs.yaml"), base)
    assert why is not None and "is not the local cluster" in why


@pytest.mark.unit
@pytest.mark.parametrize("path", sorted((ROOT / "configs" / "scenarios").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_scenario_has_a_valid_live_configuration(path: Path, tmp_path: Path) -> None:
    _, _, base = base_serve_config(LOCAL)
    scenario = load_scenario(path)
    fits = local_misfit(scenario, base) is None
    for policy in scenario.config.policies:
        args = live_args(base, scenario, policy, fits, LiveOptions(), tmp_path)
        assert args.policy == policy and set(args.router.classes()) == set(scenario.classes())
        assert {c for p in args.pools for c in p.slo_classes} <= set(scenario.classes())


@pytest.mark.unit
def test_live_workload_is_cut_and_sent_faster_at_a_smaller_time_scale() -> None:
    scenario = load_scenario(DEFAULT_SCENARIO)
    full = live_workload(scenario, 1.0, LiveOptions(duration_s=30, max_requests=1000), 1.0)
    fast = live_workload(scenario, 1.0, LiveOptions(duration_s=30, max_requests=1000), 0.5)
    assert len(fast) == len(full) and fast.span_s == pytest.approx(full.span_s / 2, rel=1e-6)
    cut = live_workload(scenario, 1.0, LiveOptions(duration_s=10, max_requests=1000), 1.0)
    assert 0 < len(cut) < len(full) and cut.span_s < 10
    assert len(live_workload(scenario, 1.0, LiveOptions(duration_s=10, max_requests=5), 1.0)) == 5


@pytest.mark.unit
def test_plan_summary_of_the_admin_plan() -> None:
    plan = {"policy": "ray-pack", "topology_fingerprint": "f", "unplaced": [{"pool": "x", "count": 2, "reason": ""}],
            "placements": [{"replica_id": "a", "tier": "nvlink", "island": "n/island0"},
                           {"replica_id": "b", "tier": "pcie", "island": "p/island0+p/island1"}]}
    assert plan_summary_json(plan) == {"policy": "ray-pack", "placed": 2, "unplaced": 2, "in_island": 1,
                                       "tp_tiers": {"nvlink": 1, "pcie": 1}, "crossing": ["b"]}


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("which", ["local-live", "prefill-decode"])
def test_live_engines_agree_with_the_simulator(which: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                               ) -> None:
    path = DEFAULT_SCENARIO
    if which == "prefill-decode":
        path = tmp_path / "pd.yaml"
        path.write_text(PD_SCENARIO)
    seen: list[str] = []

    def counters(urls: Mapping[str, str]) -> dict[str, dict[str, float]]:
        seen.extend(urls.values())
        return engine_counters(urls)

    monkeypatch.setattr(calibrate_module, "engine_counters", counters)
    result = calibrate(path, None, LiveOptions(duration_s=6, max_requests=40, time_scale=0.5), direct=True)
    print(result.table(0.15))
    assert result.requests >= 10 and result.completed == result.requests
    for metric in ("ttft_ms", "tpot_ms"):
        assert abs(result.difference(metric)) <= 0.15, result.table(0.15)
    for url in set(seen):  # nothing left running
        with pytest.raises(OSError):
            urllib.request.urlopen(f"{url}/health", timeout=1)
