"""`python -m pools fidelity`: the cost model against published measurements
(physics/data/calibration.yaml), each point with its source (the rows: `loadtest.fidelity.report`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any


def cmd_fidelity(args: argparse.Namespace) -> int:
    from loadtest.fidelity import report as fidelity

    found = fidelity.rows()
    if args.format == "json":
        print(json.dumps({"rows": [{**dataclasses.asdict(r), "ratio": r.ratio} for r in found],
                          "summary": fidelity.summary(found)}))
    else:
        print(fidelity.render(found))
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("fidelity", help="the cost model against published measurements (physics/data/calibration.yaml)")
    p.add_argument("--format", choices=["json", "text"], default="text")
    p.set_defaults(func=cmd_fidelity)
