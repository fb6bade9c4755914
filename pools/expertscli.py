"""`python -m pools experts --model M (--plan PLAN.json --pool NAME | --shape NAME) --load LOAD|zipf:S[:SEED]
[--redundant R] [--policy topology|eplb|linear] [--locality on|off] [--compare] [--topology SOURCE]
[--gpu G] --format json|text`."""

from __future__ import annotations

import argparse
import json
from typing import Any

from pools.expertmap import expert_map, map_gang, placement_of, read_plan
from pools.experts.load import load_of
from pools.experts.policies import POLICIES
from pools.experts.shapes import SHAPES, shape

COMPARED = (("eplb", True), ("eplb", False), ("topology", True), ("topology", False))
"""`--compare`: each policy with and without domain-local replica choice."""


def _answer(args: argparse.Namespace, policy: str, locality: bool) -> dict[str, Any]:
    load = load_of(args.load, args.model)
    if args.shape and (args.plan or args.pool or args.topology):
        raise ValueError("experts: --shape names a gang of its own: give it without --plan, --pool or --topology")
    if args.shape:
        found = shape(args.shape)
        answer = map_gang(args.model, found.gang, found.links, args.gpu or found.gpu, found.phase, load, policy,
                          args.redundant, locality)
        return {**answer, "shape": args.shape, "pool": None, "replica": args.shape}
    from pools.model import placement_from_json

    if not args.plan or not args.pool:
        raise ValueError("experts: give --plan and --pool, or --shape")
    placement = placement_from_json(placement_of(read_plan(args.plan), args.pool, args.replica))
    topology = None
    if args.topology:
        from topology import read_source

        topology = read_source(args.topology)
    return expert_map(args.model, placement, load, policy, args.redundant, topology, args.gpu, locality)


def _line(answer: dict[str, Any]) -> str:
    s = answer["summary"]
    where = "domain-local" if answer["locality"] else "any replica"
    return (f"{answer['policy']} ({where}): {answer['replica']} EP{answer['ep']} over {len(answer['domains'])} "
            f"domains, "
            f"{answer['redundant']} redundant: balancedness {s['balancedness']:.3f}, cross-domain "
            f"{s['cross_domain_share']:.1%} of pairs ({s['cross_domain_bytes_per_token'] / 1e6:.2f} MB per token), "
            f"{s['step']['phase']} step {s['step_ms']:.2f} ms ({s['a2a_share']:.0%} all-to-all)"
            + (f", EPLB's map in {s['eplb_layers']} of {len(answer['layers'])} layers"
               if answer["policy"] == "topology" else ""))


def cmd_experts(args: argparse.Namespace) -> int:
    locality = args.locality == "on"
    if args.compare:
        answers = [_answer(args, policy, local) for policy, local in COMPARED]
        if args.format == "json":
            print(json.dumps([{k: a[k] for k in ("policy", "locality", "ep", "redundant", "summary")}
                              for a in answers]))
        else:
            print("\n".join(_line(a) for a in answers))
        return 0
    answer = _answer(args, args.policy, locality)
    print(json.dumps(answer) if args.format == "json" else _line(answer))
    return 0


def add_experts_parser(sub: Any) -> None:
    p = sub.add_parser("experts", help="which GPU of an EP gang holds which experts (expert placement)")
    p.add_argument("--model", required=True, help="a catalogue MoE model")
    p.add_argument("--plan", help="PLAN.json as `plan --format json` prints it")
    p.add_argument("--pool", help="the plan's pool")
    p.add_argument("--replica", help="replica id (default: the pool's first)")
    p.add_argument("--shape", choices=sorted(SHAPES), help="a named gang instead of a plan's")
    p.add_argument("--load", required=True,
                   help='a load file ({"layers": [[tokens per expert], ...]}, a vLLM EPLB record) or zipf:SKEW[:SEED]')
    p.add_argument("--redundant", type=int, default=0, help="redundant experts R ((E + R) %% EP == 0)")
    p.add_argument("--policy", default="topology", choices=sorted(POLICIES))
    p.add_argument("--locality", choices=["on", "off"], default="on",
                   help="on: a token uses a replica in its own NVLink domain when there is one (the isleserve "
                        "vLLM plugin); off: any replica (vLLM's own choice)")
    p.add_argument("--compare", action="store_true", help="eplb and topology, each with and without locality")
    p.add_argument("--topology", help="the plan's topology (default: domains from the plan's island labels)")
    p.add_argument("--gpu", help="GPU for the step time (default: the shape's or topology's, else h100-sxm)")
    p.add_argument("--format", choices=["json", "text"], default="text")
    p.set_defaults(func=cmd_experts)
