"""`isle`: the project's command line, a thin dispatcher over each layer's `python -m` CLI.

    isle topology parse|show|diff|discover|survey ...

(Named `isle`, not `serve`: Ray owns the `serve` console script.) This is the only module that
may import every layer.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

USAGE = """usage: isle COMMAND [ARGS]

commands:
  topology   parse, draw, diff and discover GPU interconnects (python -m topology)
"""


def _topology(argv: Sequence[str]) -> int:
    from topology.cli import main as topology_main

    return topology_main(argv)


COMMANDS: dict[str, Callable[[Sequence[str]], int]] = {"topology": _topology}


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
