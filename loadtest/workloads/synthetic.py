"""Seeded synthetic workloads: arrivals and prompt/output lengths drawn from named distributions.

Arrivals (the first request at 0 s, then independent gaps with mean 1/rate):
- `poisson`: exponential gaps (coefficient of variation 1);
- `gamma`: gamma gaps with coefficient of variation `cv` (shape 1/cv^2): cv > 1 is burstier than
  Poisson, cv < 1 smoother. `vllm bench serve --burstiness B` is the gamma shape, so cv = 1/sqrt(B);
- `constant`: equal gaps.

Lengths (tokens, at least 1): `fixed` N; `uniform` LOW..HIGH inclusive; `lognormal` from its mean
and median (mu = ln median, sigma = sqrt(2 ln(mean / median)), the shape of real prompt and
output lengths), optionally capped at MAX (which lowers the mean a little).

The same spec and seed give the same requests: each part draws from its own generator seeded by
`"{seed}:{part}"`, so changing the output lengths does not move the arrivals.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from loadtest.model import TraceRequest
from loadtest.workloads import WorkloadError

ARRIVALS = ("poisson", "gamma", "constant")
Arrival = Literal["poisson", "gamma", "constant"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LengthDist:
    kind: Literal["fixed", "uniform", "lognormal"]
    low: int
    """fixed: the length; uniform: the smallest."""
    high: int
    """fixed: the length; uniform: the largest; lognormal: the cap."""
    mean: float
    median: float

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return self.low
        if self.kind == "uniform":
            return rng.randint(self.low, self.high)
        sigma = math.sqrt(2 * math.log(self.mean / self.median))
        return min(self.high, max(1, round(rng.lognormvariate(math.log(self.median), sigma))))

    def describe(self) -> str:
        if self.kind == "fixed":
            return str(self.low)
        if self.kind == "uniform":
            return f"uniform:{self.low}:{self.high}"
        cap = "" if self.high >= UNCAPPED else f":{self.high}"
        return f"lognormal:{self.mean:g}:{self.median:g}{cap}"


UNCAPPED = 10**9


def fixed(tokens: int) -> LengthDist:
    return LengthDist(kind="fixed", low=tokens, high=tokens, mean=tokens, median=tokens)


def _number(text: object, what: str, integer: bool = True) -> float:
    value = math.nan
    if isinstance(text, int | float | str) and not isinstance(text, bool):
        with contextlib.suppress(ValueError):
            value = float(text)
    if not math.isfinite(value) or value < 1 or (integer and value != int(value)):
        kind = "a whole number" if integer else "a number"
        raise WorkloadError(f"workload spec: {what} is {text!r}, must be {kind} >= 1")
    return value


def length_dist(spec: object, what: str) -> LengthDist:
    """`512`, `fixed:512`, `uniform:LOW:HIGH`, `lognormal:MEAN:MEDIAN[:MAX]`, or the same as a
    mapping (`{dist: lognormal, mean: 1000, median: 800, max: 8192}`)."""
    if isinstance(spec, Mapping):
        dist = spec.get("dist", "fixed")
        keys = {"fixed": ("value",), "uniform": ("min", "max"), "lognormal": ("mean", "median", "max")}.get(str(dist))
        if keys is None:
            raise WorkloadError(f"workload spec: {what}.dist is {dist!r} (fixed, uniform or lognormal)")
        unknown = sorted(set(spec) - {"dist", *keys})
        if unknown:
            raise WorkloadError(f"workload spec: {what}: unknown key {unknown[0]!r} for {dist} "
                                f"(keys: {', '.join(keys)})")
        parts = [str(dist), *(str(spec[k]) for k in keys if k in spec)]
    elif isinstance(spec, int) and not isinstance(spec, bool):
        parts = ["fixed", str(spec)]
    elif isinstance(spec, str):
        parts = spec.split(":") if ":" in spec else ["fixed", spec]
    else:
        raise WorkloadError(f"workload spec: {what} is {spec!r}: give N, uniform:LOW:HIGH or lognormal:MEAN:MEDIAN")
    return _dist(parts, what)


def _dist(parts: list[str], what: str) -> LengthDist:
    kind, args = parts[0].strip().lower(), parts[1:]
    if kind == "fixed" and len(args) == 1:
        return fixed(int(_number(args[0], what)))
    if kind == "uniform" and len(args) == 2:
        low, high = (int(_number(a, what)) for a in args)
        if low > high:
            raise WorkloadError(f"workload spec: {what}: uniform low {low} is above high {high}")
        return LengthDist(kind="uniform", low=low, high=high, mean=(low + high) / 2, median=(low + high) / 2)
    if kind == "lognormal" and len(args) in (2, 3):
        mean, median = (_number(a, what, integer=False) for a in args[:2])
        cap = int(_number(args[2], what)) if len(args) == 3 else UNCAPPED
        if mean < median:
            raise WorkloadError(f"workload spec: {what}: lognormal mean {mean:g} is below its median {median:g} "
                                "(a lognormal's mean is at least its median)")
        return LengthDist(kind="lognormal", low=1, high=cap, mean=mean, median=median)
    raise WorkloadError(f"workload spec: {what} is {':'.join(parts)!r}: give N, fixed:N, uniform:LOW:HIGH "
                        "or lognormal:MEAN:MEDIAN[:MAX]")


@dataclass(frozen=True, slots=True, kw_only=True)
class SyntheticSpec:
    rate_rps: float
    prompt: LengthDist
    output: LengthDist
    arrival: Arrival = "poisson"
    cv: float = 1.0
    """Coefficient of variation of the gaps; used by `gamma` only."""
    requests: int | None = None

    def describe(self) -> str:
        shape = f"gamma(cv={self.cv:g})" if self.arrival == "gamma" else self.arrival
        return f"{shape} at {self.rate_rps:g} req/s, prompt {self.prompt.describe()}, output {self.output.describe()}"


def arrivals_s(arrival: Arrival, rate_rps: float, cv: float, rng: random.Random) -> Iterator[float]:
    """Arrival times from 0 on: equal steps, or the running sum of exponential or gamma gaps."""
    mean = 1.0 / rate_rps
    if arrival == "constant":
        yield from (i * mean for i in itertools.count())
    shape = 1.0 / (cv * cv)
    at = 0.0
    while True:
        yield at
        at += rng.gammavariate(shape, mean / shape) if arrival == "gamma" and cv != 1.0 else rng.expovariate(rate_rps)


def generate(spec: SyntheticSpec, seed: int, max_requests: int | None = None,
             duration_s: float | None = None) -> list[TraceRequest]:
    """Requests until `spec.requests` or `max_requests` (the smaller), or the first arrival at or
    after `duration_s`; at least one bound is required."""
    limits = [n for n in (spec.requests, max_requests) if n is not None]
    if not limits and duration_s is None:
        raise WorkloadError("workload spec: a synthetic workload needs a bound: requests=N, duration_s or "
                            "max_requests (--duration / --max-requests)")
    count = min(limits) if limits else math.inf
    prompts, outputs = random.Random(f"{seed}:prompt"), random.Random(f"{seed}:output")
    out: list[TraceRequest] = []
    for at in arrivals_s(spec.arrival, spec.rate_rps, spec.cv, random.Random(f"{seed}:arrivals")):
        if len(out) >= count or (duration_s is not None and at >= duration_s):
            break
        out.append(TraceRequest(index=len(out), arrival_s=at, prompt_tokens=spec.prompt.sample(prompts),
                                output_tokens=spec.output.sample(outputs)))
    return out
