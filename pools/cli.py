"""`python -m pools` (also `isle plan`, `isle size`): plan, size, bench.

    python -m pools plan --topology SOURCE --pools POOLS.yaml --policy NAME [--format json]
    python -m pools size --topology SOURCE --model M --workload W --slo CLASS[,CLASS]
    python -m pools bench [placement|engine] [--format json]
    python -m pools cost prefill|decode|collective|kv|moe|pp ... --format json
    python -m pools experts --model M --plan PLAN.json --pool NAME --load LOAD.json [--policy P] --format json
    python -m pools launch --plan PLAN.json --pools POOLS.yaml --pool NAME [--replica ID] --format json

Exit code 2 with one line on stderr for bad input.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from pools.config import PoolsConfig, load_pools
from pools.costcli import add_cost_parsers
from pools.experts.cli import add_experts_parser
from pools.model import DEFAULT_SLO_CLASSES, PlacementPlan, PlacementRequest
from pools.placement import POLICIES, get_policy
from pools.placement.common import Layout, largest_domain
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
    """Replica counts for `replicas: auto` pools, from pool sizing."""
    from pools.sizing import size

    counts: dict[str, int] = {}
    classes = config.classes()
    for prefill, decode in config.auto_pairs():
        slos = [classes[c] for c in {*prefill.slo_classes, *decode.slo_classes}] or list(classes.values())
        proposal = size(topology, str(prefill.model), args.workload, slos, args.gpu, prefill.tp, decode.tp,
                        prefill.dp if prefill.dp > 1 else None, decode.dp if decode.dp > 1 else None)
        counts[prefill.name], counts[decode.name] = proposal.prefill_replicas, proposal.decode_replicas
        print(f"auto: {prefill.name} x {proposal.prefill_replicas}, {decode.name} x {proposal.decode_replicas} "
              f"({proposal.explanation[-1]})", file=sys.stderr)
    return counts


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
    if args.refine:  # the simulator sits a layer above pools: hand over to it, same arguments
        import subprocess
        import sys

        argv = ["--topology", args.topology, "--model", args.model, "--workload", args.workload, "--slo", args.slo,
                "--format", args.format, "--refine", *(["--gpu", args.gpu] if args.gpu else [])]
        return subprocess.run([sys.executable, "-m", "loadtest", "size", *argv], check=False).returncode
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


def _controller(address: str) -> Any:
    """The running controller actor (connects this process to the Ray cluster)."""
    import ray

    from pools.controller.controller import CONTROLLER_NAME, NAMESPACE

    try:
        ray.init(address=address, namespace=NAMESPACE, logging_level=logging.ERROR, log_to_driver=False)
    except ConnectionError as err:
        raise ValueError(f"no Ray cluster at {address}: {err}") from None
    try:
        return ray.get_actor(CONTROLLER_NAME, namespace=NAMESPACE)
    except ValueError:
        raise ValueError("no isleserve controller runs on this Ray cluster (deploy configs/*.yaml first)") from None


def cmd_mark_link(args: argparse.Namespace) -> int:
    """Tell the running controller that a link is down (or back): it drains and re-places."""
    import ray

    call: Any = _controller(args.address).mark_link.remote(args.node, args.gpu_a, args.gpu_b, args.healthy,
                                                           args.reason or "")
    moves: list[dict[str, object]] = ray.get(call)
    print(json.dumps({"moves": moves}, indent=2))
    return 0


def cmd_stop_controller(args: argparse.Namespace) -> int:
    """Stop every replica and the controller (`serve shutdown` leaves them: they are detached)."""
    import ray

    controller = _controller(args.address)
    ray.get(controller.shutdown.remote())
    ray.kill(controller, no_restart=True)
    print("isleserve controller and its replicas stopped")
    return 0


def cmd_sim_engine(args: argparse.Namespace) -> int:
    from pools.engine.run import main as run_engine

    return run_engine(args)


def cmd_engine_bench(args: argparse.Namespace) -> int:
    from pools.bench.engine import main as engine_bench

    return engine_bench(args.format)


def cmd_bench(args: argparse.Namespace) -> int:
    if args.what == "engine":
        return cmd_engine_bench(args)
    from pools.bench.placement import main as bench_main

    return bench_main(args.format, args.policy)




def cmd_launch(args: argparse.Namespace) -> int:
    """The vLLM processes that start one gang replica of a plan, node by node."""
    from pools.vllm.gang import EplbSettings, GangSettings, gang_launches, placement_from_json

    try:
        with open(args.plan, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"--plan {args.plan}: {err}") from None
    pools = {p.name: p for p in load_pools(args.pools).pool_specs()}
    if args.pool not in pools:
        raise ValueError(f"--pool {args.pool}: not in {args.pools} ({', '.join(pools)})")
    found = [p for p in doc.get("placements", []) if p.get("pool") == args.pool
             and (args.replica is None or p.get("replica_id") == args.replica)]
    if not found:
        raise ValueError(f"{args.plan} places no replica {args.replica or ''} of pool {args.pool}".replace("  ", " "))
    placement = placement_from_json(found[0])
    # vLLM takes no static expert map: a pool's redundant experts go to its own EPLB
    wanted = pools[args.pool].experts
    redundant = args.eplb_redundant if args.eplb_redundant is not None else (
        wanted.redundant if wanted is not None and wanted.redundant else None)
    eplb = None if redundant is None else EplbSettings(num_redundant_experts=redundant)
    settings = GangSettings(model=args.model or pools[args.pool].model or args.pool, address=args.address,
                            port=args.port, rpc_port=args.rpc_port, external_lb=args.external_lb, eplb=eplb)
    launches = gang_launches(placement, pools[args.pool], settings)
    if args.format == "json":
        keys = ("node", "argv", "env", "dp_ranks", "headless")
        print(json.dumps([{k: v for k, v in launch.to_json().items() if k in keys} for launch in launches], indent=2))
    else:
        import shlex

        for launch in launches:
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(launch.env.items()))
            print(f"# {launch.node}: DP ranks {list(launch.dp_ranks)}{' (headless)' if launch.headless else ''}")
            print(f"{env} {shlex.join(launch.argv)}")
    return 0


def _launch_parser(sub: Any) -> None:
    p = sub.add_parser("launch", help="the vLLM command of each node of a planned gang replica")
    p.add_argument("--plan", required=True, help="PLAN.json as `plan --format json` prints it")
    p.add_argument("--pools", required=True, help="the POOLS.yaml the plan was made with (tp, dp, pp, ep)")
    p.add_argument("--pool", required=True)
    p.add_argument("--replica", help="replica id (default: the pool's first)")
    p.add_argument("--model", help="model id or directory (default: the pool's model)")
    p.add_argument("--address", default="127.0.0.1", help="the head node's address (--data-parallel-address)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--rpc-port", type=int, default=29550)
    p.add_argument("--external-lb", action="store_true", help="one API server per DP rank")
    p.add_argument("--eplb-redundant", type=int, metavar="R", help="enable EPLB with R redundant experts")
    p.add_argument("--format", choices=["json", "text"], default="text")
    p.set_defaults(func=cmd_launch)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pools", description="placement, sizing and its benchmark")
    sub = parser.add_subparsers(dest="command", required=True)
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
    p = sub.add_parser("mark-link", help="mark a link unhealthy (or healthy again) in the running controller")
    p.add_argument("node")
    p.add_argument("gpu_a", type=int)
    p.add_argument("gpu_b", type=int)
    p.add_argument("--healthy", action="store_true", help="the link is back in service")
    p.add_argument("--reason", help="recorded with the change")
    p.add_argument("--address", default="auto", help="Ray address (default: the running cluster)")
    p.set_defaults(func=cmd_mark_link)
    p = sub.add_parser("stop-controller", help="stop the detached controller and every replica it started")
    p.add_argument("--address", default="auto", help="Ray address (default: the running cluster)")
    p.set_defaults(func=cmd_stop_controller)
    p = sub.add_parser("sim-engine", help="serve a simulated engine (OpenAI API, cost-model timing)")
    from pools.engine.run import add_arguments

    add_arguments(p)
    p.set_defaults(func=cmd_sim_engine)
    p = sub.add_parser("engine-bench", help="the same as `bench engine` (kept for old scripts)")
    p.add_argument("--format", choices=["json", "text"], default="text")
    p.set_defaults(func=cmd_engine_bench)
    p = sub.add_parser("bench", help="placement: plan and re-plan a 1,024-node cluster; engine: the simulated "
                                     "engine on the wall clock (TP, PD, 200 streams)")
    p.add_argument("what", nargs="?", choices=["placement", "engine"], default="placement")
    p.add_argument("--format", choices=["json", "text"], default="text")
    p.add_argument("--policy", default="island-aligned", choices=sorted(POLICIES))
    p.set_defaults(func=cmd_bench)
    add_cost_parsers(sub)
    add_experts_parser(sub)
    _launch_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (TopologyError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
