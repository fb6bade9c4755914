"""Fitting the cost model's free constants (`loadtest.fidelity.constants`) to published points,
and judging the model on points it was not fitted to.

    fit         for each free constant in turn (two rounds), the value in its range that
                minimises the points' loss: the mean over the points it can move of a Huber loss
                on log(predicted / published) (quadratic within a factor e^0.4 = 1.5, linear
                beyond, so that one wild point cannot drag a constant), by golden-section search
                on a log scale; a kernel no training point speaks for runs as its family's
                reference (DeepEP's: factors 1), a part fewer than two sources speak for at its
                measured share (`serving_share` 1: one source's points would make it that
                source's correction); any other constant no point moves keeps its prior
    cv          leave one source out: for every source, fit without its points, then predict
                them; the report is on those held-out predictions only

Points a fit uses: those judged by ratio that the model prices from its formulas alone (the
attainment and closed-loop points replay a simulation: they are predicted in their own fold, with
that fold's constants, but not fitted to).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from loadtest.fidelity import constants
from loadtest.fidelity.constants import FREE, Free
from loadtest.fidelity.fields import num

HUBER = 0.4
ROUNDS = 2
GOLDEN_STEPS = 18
"""Golden-section steps per constant and round: the range shrinks to 0.618^18 ~ 1.8e-4 of itself."""

Predict = Callable[[dict[str, Any]], tuple[float | None, str]]


def _huber(x: float) -> float:
    a = abs(x)
    return 0.5 * a * a if a <= HUBER else HUBER * (a - 0.5 * HUBER)


def simulated(p: dict[str, Any]) -> bool:
    """Priced by replaying a simulation (slow): predicted, never fitted to."""
    concurrency = num(p, "concurrency")
    return p["kind"] == "attainment" or (p["kind"] == "decode" and concurrency is not None and concurrency > 1
                                         and p.get("unit") == "ms")


def fittable(p: dict[str, Any], predict: Predict) -> bool:
    if simulated(p) or p.get("excluded"):
        return False
    value, _ = predict(p)
    return value is not None and value > 0 and float(p["value"]) > 0


def loss(points: Sequence[dict[str, Any]], predict: Predict) -> float:
    total = 0.0
    for p in points:
        value, _ = predict(p)
        if value is None or value <= 0:
            continue
        total += _huber(math.log(value / float(p["value"])))
    return total / max(len(points), 1)


def _golden(f: Callable[[float], float], lo: float, hi: float) -> float:
    ratio = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(GOLDEN_STEPS):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = f(d)
    return (a + b) / 2


@dataclass(frozen=True, slots=True)
class Fit:
    values: dict[str, float]
    untouched: tuple[str, ...]
    """Constants no training point could move (at their prior: the literal, or a kernel's family figure)."""
    loss: float


def fit(training: Sequence[dict[str, Any]], predict: Predict, start: Mapping[str, float] | None = None,
        free: Sequence[Free] = FREE) -> Fit:
    values = dict(start or constants.priors())
    untouched: list[str] = []
    for _ in range(ROUNDS):
        for c in free:
            moved = [p for p in training if c.moves(p)]
            if c.gpu and len({p["source_id"] for p in moved}) < 2:
                moved = []  # a part's own factor only where two sources or more speak for it
            if not moved:
                if c.name not in untouched:
                    untouched.append(c.name)
                if c.prior is not None:
                    values[c.name] = c.prior  # never a value fitted to the points held out
                continue

            def at(x: float, c: Free = c, moved: list[dict[str, Any]] = moved) -> float:
                with constants.applied({**values, c.name: math.exp(x)}):
                    return loss(moved, predict)

            found, current = _golden(at, math.log(c.low), math.log(c.high)), values[c.name]

            def flat(c: Free = c, at: Callable[[float], float] = at) -> bool:
                return c.prior is not None and abs(at(math.log(c.low)) - at(math.log(c.high))) < 1e-12

            if (current > 0 and at(found) < at(math.log(current)) - 1e-12) or (current <= 0 and not flat()):
                values[c.name] = math.exp(found)
            elif flat():
                # the points cannot tell (a constant at a prior of 0 included: points that state its
                # condition but none its mechanism prices); never a value fitted to all
                values[c.name] = c.prior if c.prior is not None else values[c.name]
    with constants.applied(values):
        total = loss(training, predict)
    return Fit(values=values, untouched=tuple(untouched), loss=total)


@dataclass(frozen=True, slots=True)
class HeldOut:
    """One point predicted by a model fitted without its source."""

    id: str
    kind: str
    source_id: str
    published: float
    predicted: float | None
    unit: str
    skipped: str = ""

    @property
    def ratio(self) -> float | None:
        return self.predicted / self.published if self.predicted is not None and self.published else None


def cross_validate(points: Sequence[dict[str, Any]], predict: Predict,
                   only: Sequence[str] = ()) -> tuple[list[HeldOut], dict[str, Fit]]:
    """Leave one source out: for each source (`only`: just these), fit on every other source's
    fittable points, then predict this source's points (all of them, simulated ones included)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for p in points:
        groups.setdefault(p["source_id"], []).append(p)
    usable = {id(p) for p in points if fittable(p, predict)}
    out: list[HeldOut] = []
    fits: dict[str, Fit] = {}
    for source in sorted(groups):
        if only and source not in only:
            continue
        training = [p for p in points if p["source_id"] != source and id(p) in usable]
        found = fit(training, predict)
        fits[source] = found
        with constants.applied(found.values):
            for p in groups[source]:
                value, why = predict(p)
                out.append(HeldOut(p["id"], p["kind"], source, float(p["value"]), value, p["unit"], why))
    return out, fits
