"""`python -m pools COMMAND ...` (and `isle pools`, `isle plan`, `isle size`): the one entry for the
subcommands the `pools` command has always had, each now owned by its layer (docs/architecture.md):

    plan, size, node-labels, bench [placement], experts    pools.cli (placement, sizing, experts)
    cost                                                   physics.cli (the cost model)
    sim-engine, engine-bench, bench engine                 simengine.cli, simengine.bench (the simulated engine)
    mark-link, stop-controller, launch                     control.cli (the Ray control plane)
    fidelity                                               loadtest.fidelity.cli (published figures)
    size --refine                                          loadtest.refine (sizing checked in the simulator)

An entry point like `isle`: it sits above every layer, imports each subcommand's home and holds no
logic of its own.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from control.cli import add_parsers as control_parsers
from loadtest.fidelity.cli import add_parser as fidelity_parser
from physics.cli import add_cost_parsers
from pools.cli import add_parsers as pools_parsers
from pools.cli import run
from simengine.bench import add_parser as engine_bench_parser
from simengine.cli import add_parsers as engine_parsers


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pools", description="placement, sizing, the cost model, "
                                     "the simulated engine and the running controller")
    sub = parser.add_subparsers(dest="command", required=True)
    pools_parsers(sub)
    add_cost_parsers(sub)
    engine_parsers(sub)
    engine_bench_parser(sub)
    control_parsers(sub)
    fidelity_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:2] == ["bench", "engine"]:  # the engine's benchmark, under its old name
        args = ["engine-bench", *args[2:]]
    if args[:1] == ["size"] and "--refine" in args:  # candidates checked in the simulator
        from loadtest.refine import main as refine

        return refine(args[1:])
    return run(build_parser(), args)


if __name__ == "__main__":
    sys.exit(main())
