"""`python -m loadtest simbench`: how fast the offline simulator runs. By default one hour of the
Azure LLM 2023 conversation trace at 16x its rate (about 310,000 requests with the full trace;
`--trace` names it, else the shipped sample is used) on 64 HGX H100 nodes serving Llama-3.1-70B
at TP=4 (128 replicas), placed island-aligned. Prints simulated requests per CPU-second."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from loadtest.sim.cluster import simulate
from loadtest.sim.model import SimConfig
from loadtest.summary import summarize
from pools.model import DEFAULT_SLO_CLASSES, PlacementRequest, PoolSpec
from pools.placement import get_policy
from topology import read_source

REPO = Path(__file__).resolve().parents[2]


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest simbench", description=__doc__)
    parser.add_argument("--trace", default="azure-conv", help="a trace file or named workload (default azure-conv)")
    parser.add_argument("--rate-scale", type=float, default=16.0)
    parser.add_argument("--duration", type=float, default=3600.0, help="seconds of the trace (after scaling)")
    parser.add_argument("--topology", default=str(REPO / "configs/clusters/hgx-64.yaml"))
    parser.add_argument("--model", default="llama-3.1-70b")
    parser.add_argument("--tp", type=int, default=4)
    parser.add_argument("--policy", default="island-aligned")
    parser.add_argument("--format", choices=["text", "json"], default="text")
    args = parser.parse_args(argv)
    from loadtest.workload import load_workload

    key = "trace" if not Path(args.trace).exists() else "path"
    workload = list(load_workload({key: args.trace, "rate_scale": args.rate_scale, "duration_s": args.duration,
                                   "class_mix": {"interactive": 0.3, "standard": 0.5, "batch": 0.2}}).requests)
    topology = read_source(args.topology)
    gpus = sum(len(n.gpus) for n in topology.nodes)
    classes = {c.name: c for c in DEFAULT_SLO_CLASSES}
    pools = (PoolSpec(name="chat", role="mixed", tp=args.tp, replicas=gpus // args.tp, model=args.model),)
    plan = get_policy(args.policy).place(PlacementRequest(topology=topology, pools=pools, slo_classes=classes))
    config = SimConfig(topology=topology, plan=plan, classes=classes, pd_enabled=False)
    t0, c0 = time.perf_counter(), time.process_time()
    result = simulate(config, workload)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    summary = summarize(result.results, classes, result.duration_s)
    figures = {"requests": len(workload), "nodes": len(topology.nodes), "replicas": len(plan.placements),
               "simulated_s": round(result.duration_s, 1), "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
               "requests_per_cpu_s": round(len(workload) / cpu, 1), "events": result.events,
               "completed": summary["completed"], "goodput_rps": summary["goodput_rps"]}
    if args.format == "json":
        print(json.dumps(figures))
    else:
        print(f"simulated {figures['requests']:,} requests ({figures['simulated_s']:,.0f} s of traffic) on "
              f"{figures['nodes']} nodes / {figures['replicas']} replicas in {figures['wall_s']:.1f} s wall, "
              f"{figures['cpu_s']:.1f} s CPU: {figures['requests_per_cpu_s']:,.0f} simulated requests per CPU-second "
              f"({figures['events']:,} events; {figures['completed']:,} completed)", file=sys.stdout)
    return 0
