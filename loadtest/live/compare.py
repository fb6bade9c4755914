"""`python -m loadtest compare SCENARIO.yaml --mode live --out DIR`: each placement policy deployed
for real on local Ray, the scenario's workload sent through its router, everything torn down.

Per policy: a Serve config derived from configs/local.yaml (`policy` replaced; the scenario's pools
when they run on the local simulated cluster, else local.yaml's, which the report says; the
scenario's SLO classes and routing), a Ray head of its own, `serve deploy`, RUNNING, then each
rate's workload through the live driver (`loadtest.live.run`) against the router, bounded by
`--duration` and `--max-requests`; the plan from `/admin/plan`. Then `serve shutdown`,
`pools stop-controller` and the head stopped by pid (`loadtest.live.deploy`), even on failure.

Times in the rows are modelled seconds: with the engines' `time_scale` s (wall seconds per
modelled second) the workload is sent s times as fast and client timings are divided by s (at
s = 1, local.yaml's default, they are wall times). Each row also records the engines' own
virtual timings (their /metrics histograms), which do not depend on this machine's speed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from isleserve.planning import resolve_topology
from isleserve.settings import AppArgs, parse_app_args
from loadtest.live.client import Target, loopback_target
from loadtest.live.deploy import ROOT, Deployment, free_ports, ray_deployment
from loadtest.live.run import Driver, pick_model
from loadtest.live.timings import (
    as_sent,
    engine_counters,
    engine_timings,
    mean_timings,
    modelled,
    prefix_counts,
    simulate_deployment,
)
from loadtest.model import RequestResult
from loadtest.report import write_plots, write_report
from loadtest.routers import RouterChoice
from loadtest.scenario import Scenario
from loadtest.summary import summarize
from loadtest.workload import Workload, load_workload
from router.config import DEV_ADMIN_KEY, DEV_KEY
from topology.configfile import load_yaml_file

APP_IMPORT = "isleserve.app:build"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LiveOptions:
    base_config: Path = ROOT / "configs" / "local.yaml"
    """The Serve config every deployment is derived from."""
    duration_s: float = 30.0
    """Wall seconds of sending per rate (the workload is cut there)."""
    max_requests: int = 300
    time_scale: float | None = None
    """Engines' wall seconds per modelled second (None: the base config's)."""
    router_port: int = 8000
    request_timeout_s: float = 60.0
    deploy_timeout_s: float = 240.0
    api_key: str = DEV_KEY
    admin_key: str = DEV_ADMIN_KEY


# the deployment's configuration
def base_serve_config(path: Path) -> tuple[dict[str, Any], int, AppArgs]:
    """The Serve config, the index of isleserve's application in it, and its validated args."""
    doc = load_yaml_file(str(path), "Serve config")
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: a Serve config is a mapping with `applications`")
    apps = doc.get("applications")
    for i, app in enumerate(apps or []):
        if isinstance(app, dict) and app.get("import_path") == APP_IMPORT:
            return doc, i, parse_app_args(app.get("args"), str(path))
    raise ValueError(f"{path}: no application with import_path {APP_IMPORT}")


def local_misfit(scenario: Scenario, base: AppArgs) -> str | None:
    """Why the scenario's pools cannot be deployed on the base config's cluster (None: they can)."""
    local = resolve_topology(base, base=ROOT)
    if scenario.topology.fingerprint() != local.fingerprint():
        return (f"its topology ({scenario.config.topology}, fingerprint {scenario.topology.fingerprint()}) is not "
                f"the local cluster ({base.topology}, fingerprint {local.fingerprint()})")
    if scenario.config.held:
        return "it reserves GPUs for other work (`held:`), which a deployment cannot express"
    return None


def live_args(base: AppArgs, scenario: Scenario, policy: str, use_pools: bool, options: LiveOptions,
              state_dir: Path, choice: RouterChoice | None = None, kv_port: int = 0) -> AppArgs:
    """The base args with this policy, the scenario's classes and routing (and pools when they
    fit). With a router `choice` (`loadtest.routers`): its profile for every class, the engines' prefix
    caches on and, for a router that indexes them, their KV events to `kv_port` on loopback (one
    router worker)."""
    cfg, routing = scenario.config, scenario.config.routing
    raw = base.model_dump(mode="json", exclude_none=True)
    router = raw["router"]
    router.update({"host": "127.0.0.1", "port": options.router_port, "seed": cfg.seed,
                   "default_profile": routing.default_profile.model_dump(mode="json"),
                   "profiles": {k: v.model_dump(mode="json") for k, v in routing.profiles.items()},
                   "pd": routing.pd.model_dump(mode="json"), "scrape_interval_s": routing.scrape_interval_s})
    if cfg.slo_classes:
        classes = [c.model_dump(mode="json", exclude_none=True) for c in cfg.slo_classes]
        raw["slo_classes"] = router["slo_classes"] = classes
    raw.update({"policy": policy, "state_dir": str(state_dir), "topology": _absolute(base.topology)})
    if options.time_scale is not None:
        raw["time_scale"] = options.time_scale
    if choice is not None:
        router.update({"default_profile": dict(choice.profile), "profiles": {}})
        router.pop("kv_events", None)
        if choice.kv_events:
            router.update({"kv_events": {"endpoint": f"tcp://127.0.0.1:{kv_port}", "block_size": 16},
                               "workers": 1})
        raw["vllm"] = {**raw.get("vllm", {}), "enable_prefix_caching": True}
    if use_pools:
        raw["pools"] = [p.model_dump(mode="json", exclude_none=True) for p in cfg.pools]
    elif cfg.slo_classes:  # the base pools, serving the scenario's classes they name (all when none is left)
        names = {c.name for c in cfg.slo_classes}
        for pool in raw["pools"]:
            pool["slo_classes"] = [c for c in pool.get("slo_classes", []) if c in names]
    return parse_app_args(raw, f"the live configuration for {scenario.name} / {policy}")


def _absolute(source: str) -> str:
    return source if source == "nvml" or Path(source).is_absolute() else str(ROOT / source)


def write_serve_config(doc: Mapping[str, Any], index: int, args: AppArgs, path: Path) -> Path:
    out = json.loads(json.dumps(doc))
    out["applications"][index]["args"] = args.model_dump(mode="json", exclude_none=True)
    path.write_text(yaml.safe_dump(out, sort_keys=False))
    return path


# the load
def live_workload(scenario: Scenario, rate: float, options: LiveOptions, time_scale: float) -> Workload:
    """The scenario's workload at `rate`, sent `1 / time_scale` times as fast, cut at the options' bounds."""
    spec = {"seed": scenario.config.seed, **scenario.config.workload}
    spec["rate_scale"] = float(spec.get("rate_scale", 1.0)) * rate
    spec["time_scale"] = float(spec.get("time_scale", 1.0)) / time_scale
    cap = options.duration_s
    if spec.get("duration_s"):
        cap = min(cap, float(spec["duration_s"]) * time_scale)
    spec["duration_s"] = cap
    spec["max_requests"] = min(int(spec.get("max_requests") or options.max_requests), options.max_requests)
    return load_workload(spec, base_dir=scenario.path.resolve().parent)


async def _drive(router_url: str, workload: Workload, options: LiveOptions) -> tuple[list[RequestResult], float, int]:
    host, port = loopback_target(router_url)
    target = Target(host, port)
    try:
        model = await pick_model(target, options.api_key)
        driver = Driver(target, workload, model, options.api_key, timeout_s=options.request_timeout_s,
                            duration_s=options.duration_s)
        results, elapsed = await driver.run()
        return results, elapsed, round(driver.max_lag_s * 1000)
    finally:
        await target.aclose()


def drive(router_url: str, workload: Workload, options: LiveOptions) -> tuple[list[RequestResult], float, int]:
    """Send the workload through the router: results, wall seconds, the client's worst lag (ms)."""
    return asyncio.run(_drive(router_url, workload, options))


def plan_summary_json(plan: Mapping[str, Any]) -> dict[str, Any]:
    """`compare.plan_summary` of a plan as /admin/plan returns it."""
    tiers: dict[str, int] = {}
    crossing = []
    for p in plan["placements"]:
        tiers[p["tier"]] = tiers.get(p["tier"], 0) + 1
        if "+" in p["island"] or p.get("extra_nodes"):
            crossing.append(p["replica_id"])
    return {"policy": plan["policy"], "placed": len(plan["placements"]),
            "unplaced": sum(u["count"] for u in plan.get("unplaced", [])),
            "in_island": len(plan["placements"]) - len(crossing), "tp_tiers": tiers, "crossing": sorted(crossing)}


def run_rate(scenario: Scenario, deployment: Deployment, args: AppArgs, rate: float, options: LiveOptions,
             notes: dict[str, Any]) -> dict[str, Any]:
    """One rate against a running deployment: the results.jsonl row."""
    workload = live_workload(scenario, rate, options, args.time_scale)
    roles = {p["replica_id"]: p["role"] for p in deployment.plan["placements"]}
    before = engine_counters(deployment.engine_urls)
    results, elapsed_s, lag_ms = drive(deployment.router_url, workload, options)
    after = engine_counters(deployment.engine_urls)
    virtual = engine_timings(before, after, roles)
    ts = args.time_scale
    results = modelled(results, ts)
    classes = args.router.classes()
    summary = summarize(results, classes, elapsed_s / ts)
    simulated = simulate_deployment(args, as_sent(results, workload.requests, 1.0))
    sim_summary = summarize(simulated, classes, elapsed_s / ts)
    span = max((r.sent_s for r in results), default=0.0)
    prefix = prefix_counts(before, after)
    return {
        "scenario": scenario.name, "mode": "live", "policy": args.policy, "routing": "scenario", "rate_scale": rate,
        **({"prefix": prefix} if prefix["queries"] else {}),
        "rate_rps": round(len(results) / span, 4) if span > 0 else math.nan, "goodput_rps": summary["goodput_rps"],
        "slo_attainment": {k: v["slo_attainment"] for k, v in summary["per_class"].items()}, "summary": summary,
        "topology_fingerprint": deployment.plan["topology_fingerprint"],
        "plan": plan_summary_json(deployment.plan), "events": [],
        "config": {"path": str(scenario.path), "seed": scenario.config.seed, "workload": scenario.config.workload,
                   "time_scale": ts, "pools": [p.model_dump(mode="json", exclude_none=True) for p in args.pools],
                   **notes},
        "live": {"router": deployment.router_url, "sent": len(results), "unsent": len(workload) - len(results),
                 "wall_s": round(elapsed_s, 3), "max_send_lag_ms": lag_ms, "workload": workload.record(),
                 "engine_virtual": _rounded(virtual), "client": _rounded(mean_timings(results)),
                 "simulated": {"goodput_rps": sim_summary["goodput_rps"], **_rounded(mean_timings(simulated))}},
    }


def _rounded(values: Mapping[str, float]) -> dict[str, float]:
    return {k: round(v, 3) for k, v in values.items()}


# the comparison
def compare_live(scenario: Scenario, out: Path, options: LiveOptions, progress: bool = True,
                 routers: Sequence[RouterChoice] = ()) -> list[dict[str, Any]]:
    """Each policy deployed, each rate sent, results.jsonl, report.md and plots written to `out`."""
    doc, index, base = base_serve_config(options.base_config)
    app = str(doc["applications"][index].get("name", "default"))
    misfit = local_misfit(scenario, base)
    notes: dict[str, Any] = {"base_config": str(options.base_config),
                             "pools_from": "scenario" if misfit is None else str(options.base_config)}
    if misfit is not None:
        notes["pools_note"] = f"the scenario's pools were not deployed because {misfit}"
    if scenario.config.faults:
        notes["faults_note"] = "the scenario's fault timeline is simulated only: live runs do not inject it"
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    router_url = f"http://127.0.0.1:{options.router_port}"
    runs: list[tuple[str, RouterChoice | None]] = [(p, None) for p in scenario.config.policies]
    if routers:
        runs = [(scenario.config.policies[0], r) for r in routers]
    with tempfile.TemporaryDirectory(prefix="isle-live-") as tmp, (out / "results.jsonl").open("w") as f:
        for policy, router in runs:
            label = policy if router is None else f"{policy}+router:{router.name}"
            name = label.replace(":", "-").replace("+", "-")
            args = live_args(base, scenario, policy, misfit is None, options, Path(tmp) / f"state-{name}", router,
                             free_ports(1)[0])
            config = write_serve_config(doc, index, args, Path(tmp) / f"serve-{name}.yaml")
            started = time.monotonic()
            _say(progress, f"{scenario.name}: {label}: starting a Ray head and deploying {len(args.pools)} pools")
            with ray_deployment(config, app, router_url, options.api_key, options.admin_key,
                                options.deploy_timeout_s) as deployment:
                deploy_s = round(time.monotonic() - started, 1)
                _say(progress, f"{scenario.name}: {label}: RUNNING after {deploy_s} s, "
                               f"{len(deployment.engine_urls)} engines (Ray head pid {deployment.ray_head_pid})")
                for rate in scenario.config.rates:
                    row = run_rate(scenario, deployment, args, rate, options, notes)
                    row["live"]["deploy_s"] = deploy_s
                    if router is not None:
                        row.update({"policy": label, "placement_policy": policy, "router": router.name,
                                    "routing": router.name})
                    rows.append(row)
                    f.write(json.dumps(row) + "\n")
                    f.flush()
                    s = row["summary"]
                    hits = f", prefix hits {row['prefix']['hit_ratio']:.1%}" if "prefix" in row else ""
                    _say(progress, f"{scenario.name}: {label} at x{rate:g}: {s['completed']}/{s['requests']} "
                                   f"completed, goodput {row['goodput_rps']:.2f} req/s, TTFT mean "
                                   f"{s['ttft_ms']['mean']:.1f} ms, p50 {s['ttft_ms']['median']:.1f} ms, TPOT mean "
                                   f"{s['tpot_ms']['mean']:.2f} ms{hits}")
            _say(progress, f"{scenario.name}: {label}: torn down after {time.monotonic() - started:.0f} s")
    shown = scenario if misfit is None else as_deployed(scenario, base)
    write_report(shown, rows, out / "report.md")
    amend_report(out / "report.md", rows, options, misfit)
    write_plots(rows, out)
    return rows


def _say(progress: bool, line: str) -> None:
    if progress:
        print(line, file=sys.stderr, flush=True)


def as_deployed(scenario: Scenario, base: AppArgs) -> Scenario:
    """The scenario as it ran live when its pools did not fit: the base config's cluster and pools."""
    topology = resolve_topology(base, base=ROOT)
    config = scenario.config.model_copy(update={"topology": base.topology, "pools": list(base.pools), "held": [],
                                                "gpu": None})
    return dataclasses.replace(scenario, config=config, topology=topology, topology_source=_absolute(base.topology))


def amend_report(path: Path, rows: Sequence[Mapping[str, Any]], options: LiveOptions, misfit: str | None) -> None:
    """The shared report, told what live mode did: how it deployed and sent, and the engines' view."""
    first = rows[0] if rows else None
    ts = first["config"]["time_scale"] if first else 1.0
    scale = ("" if ts == 1.0 else f" The engines ran at time scale {ts:g} (wall seconds per modelled second): the "
             f"workload was sent {1 / ts:g}x as fast and client times are divided by {ts:g}.")
    mode = ("- **Mode:** live. Each policy was deployed for real on a Ray head of its own (`serve deploy` of "
            f"`{options.base_config.name}` with the policy replaced), the workload sent through the product's router "
            "by the live driver, then everything was shut down. The engines are simulated: real OpenAI servers with "
            "continuous batching, timed by the cost model. Latencies are measured by the client (they include the "
            f"router and this machine's load). At most {options.duration_s:g} s of sending and "
            f"{options.max_requests} requests per run.{scale}")
    lines = [mode if line.startswith("- **Mode:**") else line for line in path.read_text().splitlines()]
    extra = []
    if misfit is not None:
        extra.append(f"- **Pools:** the scenario's pools were not deployed because {misfit}; the deployment kept "
                     f"`{options.base_config.name}`'s pools on its cluster (shown above).")
    if first and "faults_note" in first["config"]:
        extra.append(f"- **Faults:** {first['config']['faults_note']} (on a live deployment, `python -m pools "
                     "mark-link` marks a link down).")
    cut = lines.index("## Verdict") if "## Verdict" in lines else len(lines)
    lines[cut:cut] = [*extra, *([""] if extra else [])]
    lines += ["", "## Live against the simulator", "",
              "What the simulated engines recorded on their own virtual clock, what the client measured, and what "
              "the offline simulator predicts for the same plan and exactly the requests that were sent (their "
              "send times and lengths). Means over requests; TPOT per token gap. The engines' figures do not "
              "depend on this machine's speed; the client's add the router, the network stack and CPU contention "
              "here.", "",
              "| rate | policy | goodput req/s, live / simulated | TTFT mean ms: engines / client / simulated | "
              "TPOT mean ms: engines / client / simulated | deploy s |", "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        live = r["live"]
        e, c, sim = live["engine_virtual"], live["client"], live["simulated"]
        lines.append(f"| x{r['rate_scale']:g} | {r['policy']} | {r['goodput_rps']:.2f} / {sim['goodput_rps']:.2f} | "
                     f"{e['ttft_ms']:.1f} / {c['ttft_ms']:.1f} / {sim['ttft_ms']:.1f} | "
                     f"{e['tpot_ms']:.2f} / {c['tpot_ms']:.2f} / {sim['tpot_ms']:.2f} | {live['deploy_s']:.0f} |")
    path.write_text("\n".join(lines) + "\n")


def options_from(args: Any) -> LiveOptions:
    if not (args.duration > 0 and args.max_requests >= 1 and (args.time_scale is None or args.time_scale > 0)):
        raise ValueError("--duration, --max-requests and --time-scale must be positive")
    return LiveOptions(base_config=Path(args.base_config).resolve(), duration_s=args.duration,
                       max_requests=args.max_requests, time_scale=args.time_scale, router_port=args.router_port)


def add_arguments(parser: Any) -> None:
    """`compare`'s options for --mode live."""
    group = parser.add_argument_group("live mode")
    group.add_argument("--duration", type=float, default=30.0, help="seconds of sending per policy and rate")
    group.add_argument("--max-requests", type=int, default=300, help="requests per policy and rate, at most")
    group.add_argument("--time-scale", type=float, help="engines' wall seconds per modelled second "
                       "(default: the base config's)")
    group.add_argument("--router-port", type=int, default=8000, help="the deployment's router port on 127.0.0.1")
    group.add_argument("--base-config", default=str(ROOT / "configs" / "local.yaml"),
                       help="the Serve config each deployment is derived from")
