"""`python -m loadtest <command>`: run (live load against a router), compare (placement policies on
a scenario, simulated or live), sim (one simulated run), calibrate, size, chaos, bench."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

COMMANDS = {
    "run": ("loadtest.live.run", "send a workload to a router on loopback and summarise it"),
    "sim": ("loadtest.simulate", "simulate one scenario and policy offline"),
    "compare": ("loadtest.compare", "compare placement policies on a scenario (--mode sim|live)"),
    "calibrate": ("loadtest.calibrate", "one small scenario live and simulated: how far apart (mean TTFT, TPOT)"),
    "size": ("loadtest.refine", "pool sizing's candidates, checked in the simulator (--refine)"),
    "bench": ("loadtest.sim.bench", "how fast the simulator runs (an hour of Azure traffic, 64 nodes)"),
    "simbench": ("loadtest.sim.bench", "the same as `bench` (kept for old scripts)"),
    "chaos": ("loadtest.chaos.run", "the local deployment at 80% load under faults; every request accounted for"),
}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help") or args[0] not in COMMANDS:
        print("usage: python -m loadtest {" + ",".join(COMMANDS) + "} ...\n")
        for name, (_, doc) in COMMANDS.items():
            print(f"  {name:<10} {doc}")
        return 0 if args and args[0] in ("-h", "--help") else 2
    module = importlib.import_module(COMMANDS[args[0]][0])
    return int(module.main(args[1:]))


if __name__ == "__main__":
    sys.exit(main())
