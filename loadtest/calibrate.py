"""`python -m loadtest calibrate`: how far the offline simulator is from the product running live.

    python -m loadtest calibrate [--scenario configs/scenarios/local-live.yaml] [--policy NAME]
        [--duration S] [--max-requests N] [--time-scale X] [--direct] [--tolerance 0.15]
        [--format text|json]

One policy of a small scenario is deployed (on a Ray head of its own with `serve deploy`, or with
`--direct` as engine and router processes without Ray), its workload sent through the router for
at most --duration seconds, and the engines' own timings read from their /metrics before and
after. Then the simulator runs the same plan on exactly the requests that were sent (their send
times on the engines' virtual clock, the prompt lengths the engines counted, the same output
lengths), with the deployment's classes and routing. The table puts mean TTFT and TPOT side by
side: the engines' virtual timings (independent of this machine's speed; these are what the goal,
within 15 %, is about) and, for information, what the client measured on the wall clock.

TPOT is per token gap on both sides (the engines record every gap): sum of (E2E - TTFT) over sum
of (output tokens - 1). TTFT is the mean over requests. Exit status 1 when either differs by more
than --tolerance.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from isleserve.planning import plan_for, resolve_topology
from isleserve.settings import AppArgs
from loadtest.live.compare import (
    LiveOptions,
    base_serve_config,
    drive,
    live_args,
    live_workload,
    local_misfit,
    write_serve_config,
)
from loadtest.live.deploy import ROOT, DeployError, Deployment, direct_deployment, ray_deployment
from loadtest.live.timings import as_sent, engine_counters, engine_timings, mean_timings, simulate_deployment
from loadtest.scenario import load_scenario

DEFAULT_SCENARIO = ROOT / "configs" / "scenarios" / "local-live.yaml"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    scenario: str
    policy: str
    mode: str
    """ray | direct"""
    time_scale: float
    requests: int
    completed: int
    engines: dict[str, float]
    """The live engines' virtual timings: ttft_ms, tpot_ms."""
    client: dict[str, float]
    """The client's wall-clock timings in modelled ms (wall / time_scale)."""
    sim: dict[str, float]
    """The simulator's, on the same plan and requests."""

    def difference(self, metric: str, side: str = "engines") -> float:
        """(live - sim) / sim."""
        live, sim = getattr(self, side)[metric], self.sim[metric]
        return (live - sim) / sim if sim > 0 else math.nan

    def within(self, tolerance: float) -> bool:
        return all(abs(self.difference(m)) <= tolerance for m in ("ttft_ms", "tpot_ms"))

    def table(self, tolerance: float) -> str:
        lines = [f"calibration: {self.scenario}, policy {self.policy}, {self.completed}/{self.requests} requests "
                 f"completed live ({self.mode}), engines at time scale {self.time_scale:g}",
                 f"{'mean':<34}{'live':>10}{'simulated':>12}{'difference':>12}"]
        for side, label in (("engines", "engines' virtual clock"), ("client", "client, wall clock")):
            for metric, name in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT")):
                lines.append(f"{f'{name} ms ({label})':<34}{getattr(self, side)[metric]:>10.2f}"
                             f"{self.sim[metric]:>12.2f}{self.difference(metric, side):>+12.1%}")
        verdict = "within" if self.within(tolerance) else "NOT within"
        lines.append(f"engines vs simulator: {verdict} {tolerance:.0%} on mean TTFT and TPOT (the client's "
                     "figures add the router, the network stack and this machine's load)")
        return "\n".join(lines)

    def record(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "difference": {
            f"{side}_{m}": round(self.difference(m, side), 4) for side in ("engines", "client")
            for m in ("ttft_ms", "tpot_ms")}}





def check_plan(args: AppArgs, deployment: Deployment) -> None:
    """The simulator re-makes the plan: it must be the one deployed."""
    planned = {p.replica_id: (p.node, list(p.gpus)) for p in plan_for(args, resolve_topology(args, base=ROOT))
               .placements}
    deployed = {p["replica_id"]: (p["node"], list(p["gpus"])) for p in deployment.plan["placements"]}
    if planned != deployed:
        raise DeployError(f"the deployed plan {deployed} is not the one the simulator would use {planned}")


@contextlib.contextmanager
def deployed(args: AppArgs, direct: bool, options: LiveOptions, work_dir: Path, serve_doc: dict[str, Any],
             index: int) -> Iterator[Deployment]:
    if direct:
        with direct_deployment(args, work_dir) as deployment:
            yield deployment
        return
    config = write_serve_config(serve_doc, index, args, work_dir / "serve.yaml")
    app = str(serve_doc["applications"][index].get("name", "default"))
    with ray_deployment(config, app, f"http://127.0.0.1:{options.router_port}", options.api_key,
                        options.admin_key, options.deploy_timeout_s) as deployment:
        yield deployment


def calibrate(scenario_path: Path, policy: str | None, options: LiveOptions, direct: bool = False,
              progress: bool = False) -> Calibration:
    def say(line: str) -> None:
        if progress:
            print(f"calibrate: {line}", file=sys.stderr, flush=True)

    scenario = load_scenario(scenario_path, [policy] if policy else None)
    policy = scenario.config.policies[0]
    doc, index, base = base_serve_config(options.base_config)
    with tempfile.TemporaryDirectory(prefix="isle-calibrate-") as tmp:
        args = live_args(base, scenario, policy, local_misfit(scenario, base) is None, options, Path(tmp) / "state")
        workload = live_workload(scenario, scenario.config.rates[0], options, args.time_scale)
        say(f"deploying {scenario.name} with {policy} " + ("as processes (no Ray)" if direct else
                                                           "on a Ray head of its own"))
        with deployed(args, direct, options, Path(tmp), doc, index) as deployment:
            check_plan(args, deployment)
            say(f"sending {len(workload)} requests (at most {options.duration_s:g} s) to {deployment.router_url}")
            roles = {p["replica_id"]: p["role"] for p in deployment.plan["placements"]}
            before = engine_counters(deployment.engine_urls)
            results, _, _ = drive(deployment.router_url, workload, options)
            engines = engine_timings(before, engine_counters(deployment.engine_urls), roles)
            say("done; stopping the deployment, then simulating the same requests")
    ts = args.time_scale
    client = mean_timings([dataclasses.replace(r, ttft_s=r.ttft_s / ts if r.ttft_s is not None else None,
                                               e2e_s=r.e2e_s / ts if r.e2e_s is not None else None)
                           for r in results])
    sim = mean_timings(simulate_deployment(args, as_sent(results, workload.requests, ts)))
    return Calibration(scenario=scenario.name, policy=policy, mode="direct" if direct else "ray", time_scale=ts,
                       requests=len(results), completed=sum(1 for r in results if r.ok),
                       engines={"ttft_ms": round(engines["ttft_ms"], 3), "tpot_ms": round(engines["tpot_ms"], 4)},
                       client={k: round(v, 4) for k, v in client.items()}, sim={k: round(v, 4) for k, v in sim.items()})


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtest calibrate", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", default=str(DEFAULT_SCENARIO), help="a small scenario (default: local-live)")
    p.add_argument("--policy", help="placement policy (default: the scenario's first)")
    p.add_argument("--duration", type=float, default=20.0, help="seconds of sending")
    p.add_argument("--max-requests", type=int, default=200)
    p.add_argument("--time-scale", type=float, help="engines' wall seconds per modelled second (default: the "
                   "base config's)")
    p.add_argument("--direct", action="store_true", help="engine and router processes, no Ray")
    p.add_argument("--router-port", type=int, default=8000, help="the deployment's router port (Ray mode)")
    p.add_argument("--base-config", default=str(ROOT / "configs" / "local.yaml"))
    p.add_argument("--tolerance", type=float, default=0.15, help="the goal: relative difference, at most")
    p.add_argument("--format", choices=["text", "json"], default="text")
    return p


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(argv)
    if not (args.duration > 0 and args.max_requests >= 1 and (args.time_scale is None or args.time_scale > 0)):
        print("loadtest calibrate: --duration, --max-requests and --time-scale must be positive", file=sys.stderr)
        return 2
    options = LiveOptions(base_config=Path(args.base_config).resolve(), duration_s=args.duration,
                          max_requests=args.max_requests, time_scale=args.time_scale, router_port=args.router_port)
    try:
        result = calibrate(Path(args.scenario), args.policy, options, direct=args.direct,
                           progress=args.format == "text")
    except (ValueError, OSError) as err:
        print(f"loadtest calibrate: {err}", file=sys.stderr)
        return 2
    except DeployError as err:
        print(f"loadtest calibrate: the deployment failed: {err}", file=sys.stderr)
        return 1
    if args.format == "json":
        print(json.dumps(result.record(), indent=2))
    else:
        print(result.table(args.tolerance))
    return 0 if result.within(args.tolerance) else 1
