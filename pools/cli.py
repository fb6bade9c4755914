"""pools' subcommands of `python -m pools` (also `isle plan`, `isle size`): plan, size, node-labels,
bench (placement) and experts. The other subcommands belong to their layers (`pools/__main__.py`).

    python -m pools plan --topology SOURCE --pools POOLS.yaml --policy NAME [--format json]
    python -m pools size --topology SOURCE --model M --workload W --slo CLASS[,CLASS]
    python -m pools bench [placement] [--format json]
    python -m pools experts --model M --plan PLAN.json --pool NAME --load LOAD.json [--policy P] --format json

Exit code 2 with one line on stderr for bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from pools.config import PoolsConfig, load_pools
from pools.expertscli import add_experts_parser
from pools.model import DEFAULT_SLO_CLASSES, PlacementPlan, PlacementRequest
from pools.placement import POLICIES, get_policy
from pools.placement.layout import Layout, largest_domain
from pools.placement.replan import replan
from topology import Topology, TopologyError
from topology.readers import ReadOptions, read_source


def _table(plan: PlacementPlan) -> str:
    rows = [("replica", "pool", "role", "node", "gpus", "island", "tier")]
    for p in plan.placements:
        gpus = ",".join(str(g) for g in p.gpus) + "".join(f" +{n}:{','.join(map(str, g))}" for n, g in p.extra_nodes)
        rows.append((p.replica_id, p.pool, p.role, p.node, gpus, p.island, p.tier))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    for u in plan.unplaced:
        lines.append(f"unplaced: {u.count} x {u.pool}: {u.reason}")
    lines.append(f"policy {plan.policy}, topology {plan.topology_fingerprint}: {plan.gpus_used} GPUs used, "
                 f"{plan.cross_island_tp_groups} cross-island TP groups, score {plan.score:.3f}")
    return "\n".join(lines) + "\n"


def _auto_counts(config: PoolsConfig, topology: Topology, args: argparse.Namespace) -> dict[str, int]:
    """Replica counts for `replicas: auto` pools, from pool sizing (each pair's split on stderr)."""
    from pools.config import auto_counts, size_auto_pairs

    sized = size_auto_pairs(config, topology, args.workload, args.gpu)
    for prefill, decode, proposal in sized:
        print(f"auto: {prefill} x {proposal.prefill_replicas}, {decode} x {proposal.decode_replicas} "
              f"({proposal.explanation[-1]})", file=sys.stderr)
    return auto_counts(sized)


def cmd_plan(args: argparse.Namespace) -> int:
    topology = read_source(args.topology, ReadOptions(gpu=args.gpu))
    config = load_pools(args.pools)
    config.check_domains(largest_domain(Layout(topology), frozenset()))
    request = PlacementRequest(topology=topology, pools=config.pool_specs(_auto_counts(config, topology, args)),
                               slo_classes=config.classes(), seed=args.seed)
    plan = get_policy(args.policy).place(request)
    if args.replan_after:
        plan = replan(plan, read_source(args.replan_after, ReadOptions(gpu=args.gpu)), seed=args.seed).plan
    if args.format == "json":
        print(json.dumps(plan.to_json(), indent=2))
    else:
        sys.stdout.write(_table(plan))
        for line in plan.reasons:
            print(line)
        if args.explain:
            for p in plan.placements:
                print(f"{p.replica_id}: " + "; ".join(p.reasons))
    return 0


def cmd_size(args: argparse.Namespace) -> int:
    if args.refine:  # checked in the simulator, a layer above: `python -m pools` hands it over first
        raise ValueError("--refine: run it as `python -m pools size ... --refine` or `python -m loadtest size`")
    from pools.sizing import PhaseOption, size

    topology = read_source(args.topology, ReadOptions(gpu=args.gpu))
    known = {c.name: c for c in DEFAULT_SLO_CLASSES}
    names = [s.strip() for s in args.slo.split(",") if s.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ValueError(f"--slo: unknown classes {unknown} (known: {', '.join(known)})")
    proposal = size(topology, args.model, args.workload, [known[n] for n in names], args.gpu)
    doc = {
        "prefill": {"tp": proposal.prefill.tp, "dp": proposal.prefill.dp,
                    "expert_parallel": proposal.prefill.expert_parallel, "replicas": proposal.prefill_replicas},
        "decode": {"tp": proposal.decode.tp, "dp": proposal.decode.dp,
                   "expert_parallel": proposal.decode.expert_parallel, "replicas": proposal.decode_replicas},
        "gpus": proposal.gpus, "goodput_rps": round(proposal.goodput_rps, 3),
        "goodput_per_gpu": round(proposal.goodput_per_gpu, 4), "explanation": list(proposal.explanation),
    }
    if args.format == "json":
        print(json.dumps(doc, indent=2))
    else:
        def shape(o: PhaseOption) -> str:
            return f"tp={o.tp}" + (f" dp={o.dp} (EP{o.gpus})" if o.expert_parallel else "")

        print(f"prefill: {shape(proposal.prefill)} x {proposal.prefill_replicas}; decode: {shape(proposal.decode)} x "
              f"{proposal.decode_replicas}; {proposal.goodput_rps:.2f} req/s on {proposal.gpus} GPUs "
              f"({proposal.goodput_per_gpu:.3f} req/s per GPU)")
        for line in proposal.explanation:
            print(f"  {line}")
    return 0


def cmd_node_labels(args: argparse.Namespace) -> int:
    from pools.nodelabels import node_labels, node_resources, ray_start_args

    topology = read_source(args.source, ReadOptions(node_name=args.node or "node0"))
    if len(topology.nodes) == 1:
        node = topology.nodes[0]
    elif args.node and topology.has_node(args.node):
        node = topology.node(args.node)
    else:
        names = ", ".join(n.name for n in topology.nodes)
        raise ValueError(f"{args.source} has several nodes: pick one with --node ({names})")
    if args.format == "json":
        print(json.dumps({"labels": node_labels(topology, node), "resources": node_resources(topology, node)}))
    else:
        print(ray_start_args(topology, node))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from pools.bench import main as bench_main

    return bench_main(args.format, args.policy)




def add_parsers(sub: Any) -> None:
    """pools' own subcommands of `python -m pools`: plan, size, node-labels, bench (placement), experts."""
    p = sub.add_parser("plan", help="place pools on a topology")
    p.add_argument("--topology", required=True, help="capture, NCCL XML, cluster spec, template or nvml")
    p.add_argument("--pools", required=True, help="POOLS.yaml with a top-level `pools:` list")
    p.add_argument("--policy", default="island-aligned", choices=sorted(POLICIES))
    p.add_argument("--format", choices=["json", "table"], default="table")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gpu", help="GPU model when the topology source does not name it")
    p.add_argument("--replan-after", metavar="SOURCE", help="then re-plan incrementally on this topology")
    p.add_argument("--explain", action="store_true", help="print each placement's reasons")
    p.add_argument("--workload", default="azure-conv", help="for replicas: auto (see `size`)")
    p.set_defaults(func=cmd_plan)
    p = sub.add_parser("size", help="propose the prefill:decode split")
    p.add_argument("--topology", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--workload", required=True, help="azure-conv, azure-code or PROMPT:OUTPUT tokens")
    p.add_argument("--slo", required=True, help="SLO class names, comma separated")
    p.add_argument("--gpu")
    p.add_argument("--format", choices=["json", "text"], default="text")
    p.add_argument("--refine", action="store_true",
                   help="check the candidates in the simulator: runs `python -m loadtest size --refine`")
    p.set_defaults(func=cmd_size)
    p = sub.add_parser("node-labels", help="print the `ray start` labels and resources of this node")
    p.add_argument("--source", default="nvml", help="nvml (default), or a topology source for a simulated node")
    p.add_argument("--node", help="which node of a multi-node source (default: the only one)")
    p.add_argument("--format", choices=["args", "json"], default="args")
    p.set_defaults(func=cmd_node_labels)
    p = sub.add_parser("bench", help="placement: plan and re-plan a 1,024-node cluster; engine: the simulated "
                                     "engine on the wall clock (TP, PD, 200 streams)")
    p.add_argument("what", nargs="?", choices=["placement", "engine"], default="placement")
    p.add_argument("--format", choices=["json", "text"], default="text")
    p.add_argument("--policy", default="island-aligned", choices=sorted(POLICIES))
    p.set_defaults(func=cmd_bench)
    add_experts_parser(sub)


def run(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> int:
    """Parse and run a subcommand: exit code 2 and one line on stderr for bad input."""
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except (TopologyError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
