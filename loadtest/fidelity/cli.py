"""`python -m pools fidelity`: the cost model against published measurements
(physics/data/calibration.yaml and physics/data/published/*.yaml), each point with its source (the
rows: `loadtest.fidelity.report`).

    --cv source   leave-one-source-out cross-validation (`loadtest.fidelity.fit`): every source's
                  points predicted by the model fitted without them; the summary overall and per
                  kind (share within 25 %, median |log ratio|, worst ratio, points beyond 2x)
    --fit         the free constants fitted to every source at once (from their priors, the
                  literals), next to the values the model runs on; `--write` ships the fit
                  (physics/data/fitted.yaml, `physics.fitted`)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml


def judged(rows: Sequence[Any]) -> dict[str, Any]:
    """Within 25 %, median |log ratio|, worst ratio and points beyond 2x of ratio-judged rows."""
    priced = [r for r in rows if r.kind != "attainment" and r.ratio is not None and r.ratio > 0]
    logs = [abs(math.log(r.ratio)) for r in priced]
    worst = max(priced, key=lambda r: abs(math.log(r.ratio)), default=None)
    within = sum(1 for r in priced if abs(r.ratio - 1) <= 0.25 + 1e-12)
    return {"priced": len(priced), "within_25pct": within / max(len(priced), 1),
            "median_abs_log_ratio": statistics.median(logs) if logs else None,
            "beyond_2x": sum(1 for x in logs if x > math.log(2)),
            "worst": {"id": worst.id, "ratio": worst.ratio} if worst is not None else None}


def cv_report(rows: Sequence[Any]) -> dict[str, Any]:
    kinds = sorted({r.kind for r in rows})
    groups = sorted({r.source_id for r in rows})
    return {"overall": judged(rows), "by_kind": {k: judged([r for r in rows if r.kind == k]) for k in kinds},
            "by_source": {s: judged([r for r in rows if r.source_id == s]) for s in groups}}


def _render_cv(report: dict[str, Any], untouched: dict[str, tuple[str, ...]],
               held: str = "held out, predicted by the model fitted to every other source") -> str:
    lines = [f"{'kind':<12} {'priced':>6} {'within 25%':>10} {'median |log r|':>14} {'beyond 2x':>9}  worst"]
    for kind, s in [*report["by_kind"].items(), ("ALL", report["overall"])]:
        if not s["priced"]:
            continue
        worst = f"{s['worst']['id']} x{s['worst']['ratio']:.2f}" if s["worst"] else "-"
        lines.append(f"{kind:<12} {s['priced']:>6} {s['within_25pct']:>10.0%} {s['median_abs_log_ratio']:>14.3f} "
                     f"{s['beyond_2x']:>9}  {worst}")
    lines.append(f"\nby source ({held}):")
    for source, s in report["by_source"].items():
        if s["priced"]:
            kept = f"; kept at their priors: {', '.join(untouched[source])}" if untouched.get(source) else ""
            lines.append(f"  {source:<22} {s['priced']:>4} points, {s['within_25pct']:.0%} within 25%, "
                         f"median |log r| {s['median_abs_log_ratio']:.3f}{kept}")
    return "\n".join(lines)


def write_fit(values: dict[str, float], points: int, loss: float, path: Path | None = None) -> Path:
    """`physics/data/fitted.yaml`: every free constant at its fit, 4 significant digits."""
    from loadtest.fidelity import constants
    from physics import fitted

    target = path or fitted.FILE
    rows = [{"name": c.name, "where": c.where, "value": float(f"{values[c.name]:.4g}"), "mechanism": c.mechanism}
            for c in constants.FREE]
    header = ("# The cost model's free constants fitted to every published point (physics/data): the values\n"
              "# the model runs on (physics/fitted.py). Written by `python -m pools fidelity --fit --write`;\n"
              "# tests/loadtest/test_fidelity_fit.py checks that it is the fit to the shipped data.\n")
    body = yaml.safe_dump({"points": points, "loss": round(loss, 6), "constants": rows}, sort_keys=False, width=120)
    target.write_text(header + body)
    return target


def cmd_fidelity(args: argparse.Namespace) -> int:
    from loadtest.fidelity import fit as fitting
    from loadtest.fidelity import report as fidelity
    from loadtest.fidelity.predict import predict

    if args.score:
        scored = fidelity.rows([p for path in args.score for p in fidelity.points_in(Path(path))])
        report = cv_report(scored)
        if args.format == "json":
            print(json.dumps({"score": args.score, "report": report,
                              "rows": [{**dataclasses.asdict(r), "ratio": r.ratio} for r in scored]}))
        else:
            print(fidelity.render(scored))
            print("\n" + _render_cv(report, {}, held="scored by the shipped model, which never saw them"))
        return 0
    if args.cv:
        held, fits = fitting.cross_validate(fidelity.points(), predict, only=args.only or ())
        report = cv_report(held)
        untouched = {s: f.untouched for s, f in fits.items()}
        if args.format == "json":
            print(json.dumps({"cv": args.cv, "report": report, "rows": [{**dataclasses.asdict(r), "ratio": r.ratio}
                                                                          for r in held],
                              "fits": {s: dataclasses.asdict(f) for s, f in fits.items()}}))
        else:
            print(_render_cv(report, untouched))
        return 0
    if args.fit:
        from loadtest.fidelity import constants

        points = fidelity.points()
        usable = [p for p in points if fitting.fittable(p, predict)]
        found = fitting.fit(usable, predict)
        shipped, priors = constants.defaults(), constants.priors()
        if args.write:
            written = write_fit(found.values, len(usable), found.loss)
            print(f"wrote {written}", file=sys.stderr)
        if args.format == "json":
            print(json.dumps({"priors": priors, "shipped": shipped, "fitted": found.values, "loss": found.loss,
                              "points": len(usable)}))
        else:
            for c in constants.FREE:
                print(f"{c.name:<28} prior {priors[c.name]:>9.4g}  shipped {shipped[c.name]:>9.4g}  "
                      f"fitted {found.values[c.name]:>9.4g}  ({c.mechanism})")
            print(f"fitted to {len(usable)} points; loss {found.loss:.4f}")
        return 0
    found_rows = fidelity.rows()
    if args.format == "json":
        print(json.dumps({"rows": [{**dataclasses.asdict(r), "ratio": r.ratio} for r in found_rows],
                          "summary": fidelity.summary(found_rows)}))
    else:
        print(fidelity.render(found_rows))
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("fidelity", help="the cost model against published measurements (physics/data)")
    p.add_argument("--format", choices=["json", "text"], default="text")
    p.add_argument("--cv", choices=["source"], help="leave-one-source-out cross-validation")
    p.add_argument("--only", nargs="+", metavar="SOURCE", help="--cv: hold out only these sources")
    p.add_argument("--score", nargs="+", metavar="FILE",
                   help="price the points of these YAML files (the published files' form, or a list of points) with "
                        "the shipped model, without fitting to them: points it has not seen")
    p.add_argument("--fit", action="store_true", help="the free constants fitted to every published point")
    p.add_argument("--write", action="store_true",
                   help="--fit: ship the fit (physics/data/fitted.yaml, the values the model runs on)")
    p.set_defaults(func=cmd_fidelity)
