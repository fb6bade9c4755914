"""`isle`: the project's command line, a thin dispatcher over each layer's `python -m` CLI.

    isle topology parse|show|diff|discover|survey ...
    isle plan | isle size | isle pools bench ...

(Named `isle`, not `serve`: Ray owns the `serve` console script.) This is the only module that
may import every layer.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

USAGE = """usage: isle COMMAND [ARGS]

commands:
  topology   parse, draw, diff and discover GPU interconnects (python -m topology)
  plan       place pools on a topology (python -m pools plan)
  size       propose the prefill:decode split (python -m pools size)
  pools      every `python -m pools` command (bench, sim-engine, ...)
  run        the product: `serve run CONFIG` (default configs/local.yaml), a line when ready, clean stop
  router     serve the router standalone (python -m router --config FILE)
  status     a running deployment: nodes, islands, pools, replicas, health, plan
"""


def _topology(argv: Sequence[str]) -> int:
    from topology.cli import main as topology_main

    return topology_main(argv)


def _pools(argv: Sequence[str]) -> int:
    from pools.__main__ import main as pools_main

    return pools_main(argv)


def _router(argv: Sequence[str]) -> int:
    from router.cli import main as router_main

    return router_main(argv)


def _run(argv: Sequence[str]) -> int:
    from isleserve.run import main as run_main

    return run_main(argv)


def _status(argv: Sequence[str]) -> int:
    from isleserve.status import main as status_main

    return status_main(argv)


def _size(argv: Sequence[str]) -> int:
    """`isle size ... --refine` checks the candidates in the simulator (a layer above pools)."""
    if "--refine" in argv:
        from loadtest.refine import main as refine_main

        return refine_main(argv)
    return _pools(["size", *argv])


COMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "run": _run,
    "router": _router,
    "status": _status,
    "topology": _topology,
    "plan": lambda argv: _pools(["plan", *argv]),
    "size": _size,
    "pools": _pools,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0
    command = COMMANDS.get(args[0])
    if command is None:
        print(f"isle: unknown command {args[0]!r}\n\n{USAGE}", end="", file=sys.stderr)
        return 2
    return command(args[1:])


if __name__ == "__main__":
    sys.exit(main())
