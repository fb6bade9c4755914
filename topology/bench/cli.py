"""`python -m topology bench SOURCE`: measure bandwidth and latency per tier on one node (a p2p
probe per link kind, an all-reduce per island), print them, save the record with the topology
fingerprint, and with `--baseline` report (exit 1) measured bandwidth that fell below it."""

from __future__ import annotations

import argparse
import json
import sys

from topology.bench.plan import plan_probes
from topology.bench.record import BenchRecord, load, regressions, save
from topology.bench.run import MIB, BenchSettings, run
from topology.model import Topology


def _topology(source: str, node: str) -> Topology:
    if source == "nvml":
        from topology.readers.nvml import discover

        return Topology(nodes=(discover(node_name=node),))
    from topology.readers import read_source

    return read_source(source)


def render(record: BenchRecord) -> str:
    lines = [f"{record.node} ({record.backend} on {record.device}, topology {record.fingerprint})",
             f"{'probe':<34} {'link':<12} {'tier':<7} {'GB/s':>9} {'latency us':>11}"]
    for m in record.measurements:
        lines.append(f"{m.probe.name:<34} {m.probe.link:<12} {m.probe.tier:<7} {m.bandwidth_gb_s:>9.3f} "
                     f"{m.latency_us:>11.1f}")
    if record.backend == "gloo":
        lines.append("(gloo on loopback: ranks stand in for GPUs; the numbers are this host's, not the GPUs')")
    return "\n".join(lines) + "\n"


def cmd_bench(args: argparse.Namespace) -> int:
    from topology.diff import render as render_changes

    topology = _topology(args.source, args.node)
    node = args.node if topology.has_node(args.node) else topology.nodes[0].name
    settings = BenchSettings(backend=args.backend, iters=args.iters, timeout_s=args.timeout,
                             size_bytes=int(args.size_mib * MIB) if args.size_mib else None)
    record = run(topology, node, plan_probes(topology, node), args.source, settings)
    out = args.out or f"out/bench/{node}-{record.fingerprint}.json"
    save(record, out)
    if args.format == "json":
        print(json.dumps(record.to_json(), indent=2))
    else:
        sys.stdout.write(render(record))
        print(f"record: {out}")
    if args.baseline:
        changes = regressions(load(args.baseline), record)
        sys.stdout.write(render_changes(changes) if changes else f"no change beyond 10% against {args.baseline}\n")
        return 1 if any(c.worse for c in changes) else 0
    return 0


def add_bench_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("bench", help="measure bandwidth and latency per tier on this node (torch; exit 1: "
                                     "below --baseline)")
    p.add_argument("source", help="nvml (this machine) or a topology source naming the node's GPUs")
    p.add_argument("--node", default="node0", help="the node to measure (default: the first)")
    p.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto",
                   help="auto: NCCL when torch sees the GPUs, else gloo on loopback")
    p.add_argument("--size-mib", type=float, help="message size (default 256 MiB on NCCL, 8 MiB on gloo)")
    p.add_argument("--iters", type=int, help="timed iterations (default 20 on NCCL, 5 on gloo)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before the ranks are stopped")
    p.add_argument("--out", help="record file (default out/bench/NODE-FINGERPRINT.json)")
    p.add_argument("--baseline", help="an earlier record: report bandwidth more than 10%% below it")
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.set_defaults(func=cmd_bench)
