"""DistServe's vLLM-baseline chatbot benchmark (OPT-13B, ShareGPT, one A100-SXM-80GB): its requests,
their arrivals and DistServe's own measured runs of them, scored as DistServe scores it. The engine
it is replayed on: `loadtest.fidelity.replay.distserve`.

The run (LLMServe/DistServe @82831f1, Figure 8 upper, OPT-13B ShareGPT panel):

- client evaluation/ae-scripts/e2e/opt-13b-vllm-client.sh:5: 100 prompts at each per-GPU rate
  0.25 ... 3 req/s; evaluation/2-benchmark-serving/2-benchmark-serving.py: numpy and `random`
  seeded with 0 before every rate (219-222, 295, 340-349), Poisson arrivals drawn as
  np.random.gamma(1, 1/rate, 100), request i sent after the first i gaps (42-65), each asking
  for exactly its dataset output length (max_tokens, ignore_eos; 127-138), prompt + output < 2048
  (144, OPT-13B's 2048 positions);
- scoring evaluation/2-benchmark-serving/structs.py:67-68 and plot.ipynb cells 0 and 2:
  TTFT = first token's timestamp - send time, TPOT = (last - first token timestamp) /
  (output_len - 1) (0 for one token), a request attains when TTFT <= 0.25 s AND TPOT <= 0.1 s;
  attainment = the share of the 100 that do.

The workload (physics/data/distserve_opt13b_sharegpt.yaml, whose header cites every number): the
100 (prompt_len, output_len) pairs of DistServe's own measured vLLM runs of the same setup
(@20a1633 alignment data; not Figure 8's exact draw, whose dataset file is unpublished), and
Figure 8's seed-0 arrival gaps, exact.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

TTFT_SLO_S = 0.25
TPOT_SLO_S = 0.1
"""DistServe's OPT-13B ShareGPT SLOs (plot.ipynb cell 2, draw_attainment_rate_plot(..., 0.25, 0.1))."""
SOURCE = "DISTSERVE"
"""The calibration points (their `source` prefix) this workload replays."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """One request as DistServe's client measures it."""

    prompt_tokens: int
    output_tokens: int
    arrival_s: float
    ttft_s: float
    tpot_s: float
    preemptions: int = 0

    def meets_ttft(self, slo_s: float = TTFT_SLO_S) -> bool:
        return self.ttft_s <= slo_s

    def meets_tpot(self, slo_s: float = TPOT_SLO_S) -> bool:
        return self.tpot_s <= slo_s


@dataclass(frozen=True, slots=True)
class Replay:
    rate_rps: float
    outcomes: tuple[Outcome, ...]

    def attainment(self, ttft_slo_s: float = TTFT_SLO_S, tpot_slo_s: float = TPOT_SLO_S) -> float:
        """The share of requests meeting both SLOs (DistServe's get_attainment, as a fraction)."""
        ok = sum(1 for o in self.outcomes if o.meets_ttft(ttft_slo_s) and o.meets_tpot(tpot_slo_s))
        return ok / len(self.outcomes) if self.outcomes else 0.0

    def misses(self, ttft_slo_s: float = TTFT_SLO_S, tpot_slo_s: float = TPOT_SLO_S) -> dict[str, int]:
        """Requests that miss: only TTFT, only TPOT, both."""
        count: Counter[str] = Counter()
        for o in self.outcomes:
            ttft, tpot = not o.meets_ttft(ttft_slo_s), not o.meets_tpot(tpot_slo_s)
            if ttft or tpot:
                count["both" if ttft and tpot else "ttft" if ttft else "tpot"] += 1
        return {k: count.get(k, 0) for k in ("ttft", "tpot", "both")}


@dataclass(frozen=True, slots=True)
class Measured:
    """One of DistServe's own measured vLLM runs of these requests (its arrivals, not Figure 8's)."""

    rate_rps: float
    source: str
    issue_s: tuple[float, ...]
    ttft_ms: tuple[float, ...]
    tpot_ms: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Workload:
    requests: tuple[tuple[int, int], ...]
    """(prompt_len, output_len), in the order they are sent."""
    unit_intervals: tuple[float, ...]
    """Figure 8's arrival gaps at 1 req/s (numpy RandomState(0).gamma(1, 1, 100))."""
    measured: tuple[Measured, ...]

    def arrivals(self, rate_rps: float, seed: int | None = None) -> tuple[float, ...]:
        """Send times (s) at `rate_rps`: request i after the first i gaps, as DistServe's client.
        seed None: Figure 8's own gaps (seed 0 of numpy's legacy stream) scaled by 1 / rate;
        an int: exponential gaps from Python's `random.Random(seed)` (another Poisson sample)."""
        if rate_rps <= 0:
            raise ValueError(f"rate must be positive, got {rate_rps}")
        n = len(self.requests)
        if seed is None:
            gaps = [g * (1.0 / rate_rps) for g in self.unit_intervals[:n]]
        else:
            rng = random.Random(seed)
            gaps = [rng.expovariate(rate_rps) for _ in range(n)]
        out, t = [], 0.0
        for gap in gaps:
            out.append(t)
            t += gap
        return tuple(out)

    def measured_replay(self, rate_rps: float) -> Replay:
        """A measured run as a `Replay`, to score it the same way."""
        for m in self.measured:
            if m.rate_rps == rate_rps:
                return Replay(rate_rps, tuple(
                    Outcome(p, o, a, ttft / 1000, tpot / 1000)
                    for (p, o), a, ttft, tpot in zip(self.requests, m.issue_s, m.ttft_ms, m.tpot_ms, strict=True)))
        raise KeyError(f"no measured run at {rate_rps} req/s (have {[m.rate_rps for m in self.measured]})")


@lru_cache(maxsize=1)
def workload() -> Workload:
    raw: dict[str, Any] = yaml.safe_load(
        resources.files("physics").joinpath("data/distserve_opt13b_sharegpt.yaml").read_text())
    return Workload(
        requests=tuple((int(p), int(o)) for p, o in raw["requests"]),
        unit_intervals=tuple(float(g) for g in raw["unit_intervals"]),
        measured=tuple(Measured(float(m["rate_rps"]), str(m["source"]), tuple(map(float, m["issue_s"])),
                                tuple(map(float, m["ttft_ms"])), tuple(map(float, m["tpot_ms"])))
                       for m in raw["measured"]))
