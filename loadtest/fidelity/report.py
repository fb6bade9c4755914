"""`python -m pools fidelity`: every published point in `physics/data/calibration.yaml` next to what
the cost model predicts for the same conditions (through `physics.queries`, the `cost` command's
answers): published, predicted, ratio (predicted / published, in the published unit), source;
then the summary (share within 25 %, median |log ratio|, the worst three). An SLO attainment
point is priced by replaying its benchmark through the simulated engine (`loadtest.fidelity.replay`) and
judged by absolute difference instead (within 0.1 of the published share). A point the model
cannot price yet (a model or GPU the catalogue lacks, a bandwidth-only figure, an attainment
curve with no replayable workload) is listed with the reason, never dropped silently.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from loadtest.fidelity.predict import predict

__all__ = ["ABS_WITHIN", "PUBLISHED", "WITHIN", "Row", "points", "predict", "render", "rows", "source_id", "sources",
           "summary"]

WITHIN = 0.25
"""Ratio kinds: within when |predicted / published - 1| <= this."""
ABS_WITHIN = {"attainment": 0.1}
"""Kinds judged by |predicted - published| in their unit instead of by ratio: an SLO attainment is
a share of requests (0.45 against 0.55 is 10 points of 100, not 18 %)."""


@dataclass(frozen=True, slots=True)
class Row:
    id: str
    kind: str
    published: float
    unit: str
    predicted: float | None
    source: str
    skipped: str = ""
    source_id: str = ""

    @property
    def ratio(self) -> float | None:
        return self.predicted / self.published if self.predicted is not None and self.published else None

    @property
    def absolute(self) -> bool:
        """Judged by absolute difference (`ABS_WITHIN`), not by ratio."""
        return self.kind in ABS_WITHIN

    @property
    def within(self) -> bool | None:
        """Within its kind's tolerance; None when not priced."""
        if self.predicted is None:
            return None
        if self.absolute:
            return abs(self.predicted - self.published) <= ABS_WITHIN[self.kind] + 1e-9
        return self.ratio is not None and self.ratio > 0 and abs(self.ratio - 1) <= WITHIN

    @property
    def tolerance(self) -> str:
        return f"+-{ABS_WITHIN[self.kind]:g} abs" if self.absolute else f"+-{WITHIN:.0%}"


PUBLISHED = "data/published"
"""Points collected after the calibration set (physics/data/published/*.yaml), each file with its
`sources` (short name -> URL, pin) and `points`; every point names its `source_id`."""


def _files() -> list[tuple[str, dict[str, Any]]]:
    root = resources.files("physics")
    found = [("calibration.yaml", yaml.safe_load(root.joinpath("data/calibration.yaml").read_text()))]
    folder = root.joinpath(PUBLISHED)
    if folder.is_dir():
        for entry in sorted(folder.iterdir(), key=lambda e: e.name):
            if entry.name.endswith(".yaml"):
                data = yaml.safe_load(entry.read_text())
                if isinstance(data, dict) and data.get("points"):
                    found.append((entry.name, data))
    return found


def source_id(p: dict[str, Any]) -> str:
    """The source a point comes from (the cross-validation group): its `source_id`, or the short
    name its `source` starts with (calibration.yaml: "DEEPEP, low-latency kernels table, ...")."""
    if p.get("source_id"):
        return str(p["source_id"])
    text = str(p.get("source", ""))
    for mark in (",", ":"):
        text = text.split(mark, 1)[0]
    return text.strip() or "unknown"


def points() -> list[dict[str, Any]]:
    """Every published point: the calibration set, then each file of `PUBLISHED`; each with its
    `source_id` and the `file` it is kept in."""
    out: list[dict[str, Any]] = []
    for name, data in _files():
        for p in data["points"]:
            out.append({**p, "source_id": source_id(p), "file": name})
    return out


def sources() -> dict[str, dict[str, Any]]:
    """Short name -> where it is (URL, pin, what), over every file that lists its sources."""
    out: dict[str, dict[str, Any]] = {}
    for _, data in _files():
        out.update(data.get("sources") or {})
    return out


def points_in(path: Path) -> list[dict[str, Any]]:
    """The points of a file in the published files' form (a mapping with `points`, and `sources`
    if it likes) or a bare list of points, each with its `source_id` and the `file`: for scoring
    points the model has not seen (`pools fidelity --score`). A file that is not such a list, or a
    point without its id, kind, value and unit, is refused with what is wrong."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ValueError(f"{path}: {err}") from None
    found = data.get("points") if isinstance(data, dict) else data
    if not isinstance(found, list) or not all(isinstance(p, dict) for p in found):
        raise ValueError(f"{path}: not a list of points (or a mapping with `points`)")
    for i, p in enumerate(found):
        missing = [k for k in ("id", "kind", "value", "unit") if k not in p]
        if missing or not isinstance(p.get("value"), int | float) or isinstance(p.get("value"), bool):
            raise ValueError(f"{path}: point {p.get('id', i)!r} needs " +
                             (", ".join(missing) if missing else "a numeric value"))
    return [{**p, "source": str(p.get("source", "")), "source_id": source_id(p), "file": path.name} for p in found]


def rows(found: list[dict[str, Any]] | None = None) -> list[Row]:
    """Each point (every published one by default) with what the shipped model predicts for it."""
    out = []
    for p in points() if found is None else found:
        predicted, why = predict(p)
        out.append(Row(p["id"], p["kind"], float(p["value"]), p["unit"], predicted, p["source"], why,
                       p["source_id"]))
    return out


def summary(found: list[Row]) -> dict[str, Any]:
    """Ratio kinds: share within 25 %, median |log ratio|, the worst three; each absolute kind
    (`ABS_WITHIN`): its tolerance, how many are within it, the largest |difference|."""
    priced = [r for r in found if not r.absolute and r.ratio is not None and r.ratio > 0]
    logs = [abs(math.log(r.ratio)) for r in priced if r.ratio]
    worst = sorted(priced, key=lambda r: -abs(math.log(r.ratio or 1.0)))[:3]
    absolute: dict[str, dict[str, Any]] = {}
    for kind, tol in ABS_WITHIN.items():
        rows = [r for r in found if r.kind == kind and r.predicted is not None]
        diffs = [abs((r.predicted or 0.0) - r.published) for r in rows]
        absolute[kind] = {"tolerance": tol, "priced": len(rows), "within": sum(1 for r in rows if r.within),
                          "max_abs_diff": max(diffs) if diffs else None}
    n_priced = len(priced) + sum(a["priced"] for a in absolute.values())
    return {"points": len(found), "priced": n_priced, "skipped": len(found) - n_priced,
            "within_25pct": sum(1 for r in priced if r.within) / max(len(priced), 1),
            "median_abs_log_ratio": statistics.median(logs) if logs else None,
            "worst": [{"id": r.id, "ratio": r.ratio} for r in worst],
            "absolute": absolute}


def render(found: list[Row]) -> str:
    lines = [f"{'point':<44} {'kind':<10} {'published':>12} {'predicted':>12} {'ratio':>7} {'within':>6}  source"]
    for r in found:
        pred = f"{r.predicted:12.4g}" if r.predicted is not None else f"{'-':>12}"
        ratio = f"{r.ratio:7.2f}" if r.ratio is not None else f"{'-':>7}"
        within = {None: "-", True: "yes", False: "no"}[r.within]
        tail = r.source if not r.skipped else f"(skipped: {r.skipped}) {r.source}"
        unit = f"{r.unit} ({r.tolerance})" if r.absolute else r.unit
        lines.append(f"{r.id:<44} {r.kind:<10} {r.published:12.4g} {pred} {ratio} {within:>6}  {unit}; {tail}")
    s = summary(found)
    median = s["median_abs_log_ratio"]
    lines.append(f"\n{s['priced']} of {s['points']} points priced; within 25%: {s['within_25pct']:.0%}; median |log "
                 f"ratio| {median:.3f}" if median is not None else "\nno point priced")
    for kind, a in s["absolute"].items():
        if a["priced"]:
            lines.append(f"{kind}: within +-{a['tolerance']:g} (absolute): {a['within']} of {a['priced']}; "
                         f"largest |predicted - published| {a['max_abs_diff']:.2f}")
    lines.append("worst: " + ", ".join(f"{w['id']} x{w['ratio']:.2f}" for w in s["worst"]))
    return "\n".join(lines)
