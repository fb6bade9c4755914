"""`python -m loadtest compare SCENARIO.yaml --mode sim|live --out DIR`: the same workload and seed
under each placement policy (and rate), through the offline simulator (or, `--mode live`, deployed
on local Ray: `loadtest.live.compare`); writes `DIR/results.jsonl`
(one line per policy and rate), `DIR/report.md` and PNG plots at the top of DIR."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from loadtest import scaling_report
from loadtest.live import compare as livecompare
from loadtest.live.deploy import DeployError
from loadtest.model import TraceRequest
from loadtest.report import write_plots, write_report
from loadtest.routers import ROUTERS, RouterChoice, routers
from loadtest.scenario import Scenario, load_scenario
from loadtest.sim.cluster import simulate
from loadtest.sim.model import AutoscaleSettings, SimConfig
from loadtest.summary import summarize
from physics import catalog
from physics.moecost import moe_step
from pools.ganglinks import gang_links
from pools.model import ExpertChoice, PlacementPlan, PlacementRequest, PoolSpec
from pools.placement import get_policy
from router.config import ProfileConfig
from topology import GpuRef, Topology, TopologyError

GANG_BATCH, GANG_CONTEXT = 64, 1024
"""The reference decode step the report prices each gang's all-to-all share at."""


def gang_rows(topology: Topology, plan: PlacementPlan) -> list[dict[str, Any]]:
    """Each expert-parallel gang: its links' carrier, nodes and all-to-all share at the reference step."""
    out = []
    for p in plan.placements:
        pool = plan.pool(p.pool)
        if not p.members or not pool.expert_parallel or pool.model is None:
            continue
        links = gang_links(topology, p)
        first = topology.gpu(GpuRef(p.node, p.gpus[0])).model
        step = moe_step(catalog.model(pool.model), catalog.gpu(first or "h100-sxm"), pool.tp, pool.dp, links,
                        decodes=GANG_BATCH, decode_context=GANG_CONTEXT) if first in catalog.gpus() else None
        out.append({"replica": p.replica_id, "shape": f"TP={pool.tp} DP={pool.dp} EP{pool.ep_size}",
                    "carrier": links.carrier, "nodes": len({m.node for m in p.members}),
                    "a2a_share": round(step.a2a_share, 4) if step else None,
                    "step_ms": round(step.total_ms, 3) if step else None})
    return out


def plan_summary(plan: PlacementPlan, topology: Topology | None = None) -> dict[str, Any]:
    tiers: dict[str, int] = {}
    for p in plan.placements:
        tiers[p.tier] = tiers.get(p.tier, 0) + 1
    return {"policy": plan.policy, "placed": len(plan.placements), "unplaced": len(plan.unplaced),
            "in_island": sum(1 for p in plan.placements if p.in_island), "tp_tiers": tiers,
            "crossing": sorted(p.replica_id for p in plan.placements if not p.in_island),
            "gpus_used": plan.gpus_used, "cross_domain_ep_groups": plan.cross_domain_ep_groups,
            "pp_boundaries": dict(plan.pp_boundaries),
            "gangs": gang_rows(topology, plan) if topology is not None else []}


def workload_for(scenario: Scenario, rate: float) -> list[TraceRequest]:
    from loadtest.workload import load_workload

    spec = {"seed": scenario.config.seed, **scenario.config.workload}
    spec["rate_scale"] = float(spec.get("rate_scale", 1.0)) * rate
    return list(load_workload(spec, base_dir=scenario.path.resolve().parent).requests)


def autoscale_settings(scenario: Scenario, autoscaler: str) -> tuple[tuple[PoolSpec, ...], AutoscaleSettings | None]:
    """The pools an autoscaled run starts with (its pools at `initial_replicas`) and its settings;
    `static`: the scenario's counts throughout."""
    auto = scenario.config.autoscaling
    pools = scenario.pools()
    if auto is None or autoscaler == "static":
        return pools, None
    start = {name: c.initial(None) for name, c in auto.pools.items()}
    configs = {name: c.policy() for name, c in auto.pools.items()}
    return (tuple(replace(p, replicas=start.get(p.name, p.replicas)) for p in pools),
            AutoscaleSettings(kind=autoscaler, configs=configs, interval_s=auto.interval_s, startup_s=auto.startup_s,
                              window_s=auto.window_s, look_back_s=auto.look_back_s))


def run_one(scenario: Scenario, policy: str, rate: float, workload: Sequence[TraceRequest],
            expert_policy: str | None = None, autoscaler: str | None = None, locality: bool = True,
            router: RouterChoice | None = None) -> dict[str, Any]:
    """One placement policy (and expert policy, for EP gangs; or autoscaler) at one rate. With an
    expert policy the row's `policy` is `PLACEMENT+EXPERTS` (`+any-copy` without domain-local
    copies: vLLM's own choice) and `placement_policy`/`expert_policy`/`expert_locality` say each;
    with an autoscaler, `autoscaler` names it (`blind` places with first-fit); with a router
    (`loadtest.routers`), every engine keeps a prefix cache and every class routes with the
    router's profile: the row's `policy` is `PLACEMENT+router:NAME`, and `prefix` holds the
    engines' prefix-cache queries and hits (tokens) and their ratio."""
    classes = scenario.classes()
    pools, autoscale = autoscale_settings(scenario, autoscaler) if autoscaler else (scenario.pools(), None)
    if autoscaler == "blind":
        policy = "first-fit"
    request = PlacementRequest(topology=scenario.topology, pools=pools, slo_classes=classes,
                               seed=scenario.config.seed, occupied=scenario.held())
    plan = get_policy(policy).place(request)
    routing = scenario.config.routing
    profiles = scenario.profiles()
    if router is not None:
        shared = ProfileConfig.model_validate(router.profile).to_profile(f"router {router.name}")
        profiles = {name: shared for name in classes}
    config = SimConfig(topology=scenario.topology, plan=plan, classes=classes, profiles=profiles,
                       pd_enabled=routing.pd.enabled, pd_min_prompt_tokens=routing.pd.min_prompt_tokens,
                       scrape_interval_s=routing.scrape_interval_s, faults=scenario.faults(),
                       seed=scenario.config.seed, model=scenario.model(), detect_s=scenario.config.detect_s,
                       experts=None if expert_policy is None else ExpertChoice(
                           policy=expert_policy, load=scenario.config.expert_load,
                           redundant=scenario.config.redundant_experts, locality=locality), autoscale=autoscale,
                       prefix_caching=router is not None, kv_index=router is not None and router.kv_events)
    t0 = time.process_time()
    result = simulate(config, workload)
    cpu_s = time.process_time() - t0
    span = max((r.arrival_s for r in workload), default=0.0)
    summary = summarize(result.results, classes, max(result.duration_s, span, 1e-9))
    label = policy if router is None else f"{policy}+router:{router.name}"
    return {
        "scenario": scenario.name, "mode": "sim", "routing": "scenario" if router is None else router.name,
        **({"router": router.name, "placement_policy": policy, "prefix": prefix_row(result.prefix)}
           if router is not None else {}),
        "policy": label if expert_policy is None and autoscaler is None
        else f"{policy}+{expert_policy}{'' if locality else '+any-copy'}" if autoscaler is None
        else f"{policy}+autoscale:{autoscaler}",
        **({"placement_policy": policy, "expert_policy": expert_policy, "expert_locality": locality}
           if expert_policy is not None else {}),
        "rate_scale": rate, "rate_rps": round(len(workload) / span, 4) if span > 0 else math.nan,
        "goodput_rps": summary["goodput_rps"],
        "output_tokens_per_gpu_s": round(summary["good_output_tok_s"] / max(plan.gpus_used, 1), 3),
        **({"autoscaler": autoscaler, "attainment": {k: v["slo_attainment"] for k, v in summary["per_class"].items()},
            "gpu_hours": round(result.gpu_hours, 4),
            "scale_events": sum(1 for e in result.log if e.get("event") == "scale"),
            **scaling_report.row_figures(result.results, classes, scenario.config.workload, result.timeline, plan,
                                         result.duration_s)} if autoscaler else {}),
        "tpot_p99_ms": summary["tpot_ms"].get("p99", math.nan),
        "slo_attainment": {k: v["slo_attainment"] for k, v in summary["per_class"].items()},
        "summary": summary, "topology_fingerprint": scenario.topology.fingerprint(),
        "plan": plan_summary(plan, scenario.topology),
        "events": result.log, "config": {"path": str(scenario.path), "seed": scenario.config.seed,
                                         "workload": scenario.config.workload},
        "sim": {"events": result.events, "cpu_s": round(cpu_s, 3),
                "requests_per_cpu_s": round(len(workload) / cpu_s, 1) if cpu_s > 0 else math.nan},
    }


def prefix_row(prefix: dict[str, int]) -> dict[str, Any]:
    """The engines' prefix-cache counts and their hit ratio (hits / queries, vLLM's)."""
    queries = prefix.get("queries", 0)
    return {**prefix, "hit_ratio": round(prefix.get("hits", 0) / queries, 4) if queries else 0.0}


def compare(scenario: Scenario, out: Path, progress: bool = True, autoscalers: Sequence[str] = (),
            routers: Sequence[RouterChoice] = ()) -> list[dict[str, Any]]:
    """Every policy (x expert policy) at every rate; with `autoscalers`, every autoscaler
    instead, with the scenario's first policy (`blind`: first-fit); with `routers`, every
    router instead, with the scenario's first policy."""
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    runs: list[tuple[str, str | None, str | None, bool, RouterChoice | None]] = [
        (p, e, None, local, None) for p in scenario.config.policies for e in scenario.config.expert_policies()
        for local in (scenario.config.expert_localities() if e is not None else [True])]
    if autoscalers:
        runs = [(scenario.config.policies[0], None, a, True, None) for a in autoscalers]
    if routers:
        runs = [(scenario.config.policies[0], None, None, True, r) for r in routers]
    with (out / "results.jsonl").open("w") as f:
        for rate in scenario.config.rates:
            workload = workload_for(scenario, rate)
            for policy, experts, autoscaler, local, router in runs:
                row = run_one(scenario, policy, rate, workload, experts, autoscaler, local, router)
                rows.append(row)
                f.write(json.dumps(row) + "\n")
                f.flush()
                if progress:
                    hits = f", prefix hits {row['prefix']['hit_ratio']:.1%}" if "prefix" in row else ""
                    print(f"{scenario.name}: {row['policy']} at x{rate:g} ({row['rate_rps']:.2f} req/s): goodput "
                          f"{row['goodput_rps']:.2f} req/s, TTFT p50 {row['summary']['ttft_ms']['median']:.0f} ms"
                          f"{hits}, simulated {len(workload)} requests in {row['sim']['cpu_s']:.1f} s CPU",
                          file=sys.stderr)
    write_report(scenario, rows, out / "report.md")
    write_plots(rows, out)
    scaling_report.write_plots(rows, out)
    return rows


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest compare",
                                     description="placement policies side by side on one scenario")
    parser.add_argument("scenario")
    parser.add_argument("--mode", choices=["sim", "live"], default="sim")
    parser.add_argument("--out", required=True, help="directory for results.jsonl, report.md and plots")
    parser.add_argument("--policies", help="comma-separated policy names (overrides the scenario's list)")
    parser.add_argument("--autoscalers", help="comma-separated: static, blind, topology (the scenario needs an "
                                              "`autoscaling:` block); compares them instead of the policies")
    parser.add_argument("--routers", help="comma-separated: " + ", ".join(ROUTERS) + " (engines with prefix "
                                          "caching; compares them instead of the policies)")
    parser.add_argument("--quiet", action="store_true")
    livecompare.add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        scenario = load_scenario(args.scenario, args.policies.split(",") if args.policies else None)
        chosen = routers(args.routers) if args.routers else []
        if chosen and args.autoscalers:
            raise ValueError("--routers and --autoscalers: one comparison at a time")
        if args.mode == "live":
            livecompare.compare_live(scenario, Path(args.out), livecompare.options_from(args), progress=not args.quiet,
                                     routers=chosen)
        else:
            autoscalers = [a for a in (args.autoscalers or "").split(",") if a]
            if autoscalers and scenario.config.autoscaling is None:
                raise ValueError(f"{args.scenario}: --autoscalers needs an `autoscaling:` block in the scenario")
            bad = sorted(set(autoscalers) - {"static", "blind", "topology"})
            if bad:
                raise ValueError(f"--autoscalers: unknown {bad} (static, blind, topology)")
            compare(scenario, Path(args.out), progress=not args.quiet, autoscalers=autoscalers, routers=chosen)
    except (TopologyError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except DeployError as err:
        print(f"error: the live deployment failed: {err}", file=sys.stderr)
        return 1
    print(Path(args.out) / "report.md")
    return 0
