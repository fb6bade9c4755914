"""`python -m pools experts --model M --plan PLAN.json --pool NAME --load LOAD.json|zipf:S[:SEED]
[--redundant R] [--policy topology|eplb|linear] [--topology SOURCE] [--gpu G] --format json|text`."""

from __future__ import annotations

import argparse
import json
from typing import Any

from pools.expertmap import expert_map, placement_of, read_plan
from pools.experts.load import load_of
from pools.experts.policies import POLICIES


def cmd_experts(args: argparse.Namespace) -> int:
    from pools.model import placement_from_json

    placement = placement_from_json(placement_of(read_plan(args.plan), args.pool, args.replica))
    topology = None
    if args.topology:
        from topology import read_source

        topology = read_source(args.topology)
    answer = expert_map(args.model, placement, load_of(args.load, args.model), args.policy, args.redundant,
                        topology, args.gpu)
    if args.format == "json":
        print(json.dumps(answer))
    else:
        s = answer["summary"]
        print(f"{answer['policy']}: {answer['replica']} EP{answer['ep']} over {len(answer['domains'])} domains, "
              f"{answer['redundant']} redundant: balancedness {s['balancedness']:.3f}, cross-domain "
              f"{s['cross_domain_share']:.1%} of pairs ({s['cross_domain_bytes_per_token'] / 1e6:.2f} MB per token), "
              f"decode step {s['step_ms']:.1f} ms ({s['a2a_share']:.0%} all-to-all)")
    return 0


def add_experts_parser(sub: Any) -> None:
    p = sub.add_parser("experts", help="which GPU of an EP gang holds which experts (expert placement)")
    p.add_argument("--model", required=True, help="a catalogue MoE model")
    p.add_argument("--plan", required=True, help="PLAN.json as `plan --format json` prints it")
    p.add_argument("--pool", required=True)
    p.add_argument("--replica", help="replica id (default: the pool's first)")
    p.add_argument("--load", required=True, help='{"layers": [[tokens per expert], ...]} or zipf:SKEW[:SEED]')
    p.add_argument("--redundant", type=int, default=0, help="redundant experts R ((E + R) %% EP == 0)")
    p.add_argument("--policy", default="topology", choices=sorted(POLICIES))
    p.add_argument("--topology", help="the plan's topology (default: domains from the plan's island labels)")
    p.add_argument("--gpu", help="GPU for the step time (default: the topology's, else h100-sxm)")
    p.add_argument("--format", choices=["json", "text"], default="text")
    p.set_defaults(func=cmd_experts)
