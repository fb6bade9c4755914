"""`python -m loadtest sim SCENARIO [--policy P] [--rate X]`: one simulated run of a scenario with
one placement policy, summarised as `vllm bench serve` does (JSON with --format json)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from loadtest.compare import run_one, workload_for
from loadtest.scenario import load_scenario
from loadtest.summary import format_summary
from topology import TopologyError


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest sim", description=__doc__)
    parser.add_argument("scenario")
    parser.add_argument("--policy", help="placement policy (default: the scenario's first)")
    parser.add_argument("--rate", type=float, help="rate multiplier (default: the scenario's first)")
    parser.add_argument("--format", choices=["text", "json"], default="text")
    args = parser.parse_args(argv)
    try:
        scenario = load_scenario(args.scenario, [args.policy] if args.policy else None)
        rate = args.rate if args.rate is not None else scenario.config.rates[0]
        row = run_one(scenario, scenario.config.policies[0], rate, workload_for(scenario, rate))
    except (TopologyError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps(row))
    else:
        print(f"{scenario.name}: {row['policy']} at x{rate:g} ({row['rate_rps']:.2f} req/s offered), simulated "
              f"in {row['sim']['cpu_s']:.1f} s CPU")
        print(format_summary(row["summary"]))
    return 0
