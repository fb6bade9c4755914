"""What the Makefile asks about the compiled request path (wire/native.py), around its build:

    python -m wire.build check         exit 0 when the compiled modules match the sources
    python -m wire.build report LOG RC after `pip install -e .` wrote LOG and exited RC: one line
                                       when it compiled; when it did not, why, the log's last
                                       lines and how to try again (exit 0: the product runs
                                       interpreted); RC when pip itself failed

A build that failed is not recorded as done: the next `make` target tries again."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from wire import native

TAIL_LINES = 25
RULE = "isleserve: " + "*" * 72


def report(log: Path, pip_status: int, root: Path = native.ROOT) -> int:
    if pip_status == 0 and native.judge(root) == "compiled":
        print(f"isleserve: request path compiled (mypyc: {len(native.COMPILED)} modules)", file=sys.stderr)
        return 0
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    failed = native.read_manifest(root).get("failed")
    out = [RULE, "isleserve: the request path was NOT compiled: it runs interpreted (the router is slower)"]
    if pip_status:
        out.append(f"isleserve: `pip install -e .` exited {pip_status}")
    if failed:
        out.append(f"isleserve: why: {str(failed).strip()[:500]}")
    out.append(f"isleserve: the last lines of {log}:")
    out += [f"  {line}" for line in lines[-TAIL_LINES:]]
    out += ["isleserve: fix the cause, then `make install-run` (or any make target) compiles again",
            f"isleserve: (the whole build log: {log})", RULE]
    print("\n".join(out), file=sys.stderr)
    return pip_status


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["check"]:
        return 0 if native.up_to_date() else 1
    if len(args) == 3 and args[0] == "report" and args[2].lstrip("-").isdigit():
        return report(Path(args[1]), int(args[2]))
    print("usage: python -m wire.build check | report LOG PIP_STATUS", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
