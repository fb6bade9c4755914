"""The chaos run's requests, and the text each must come back with.

Every request carries a `seed`: the simulated engine draws its words from a generator seeded by
it (`wire.text.TokenText`), so the exact words a stream must deliver are known here, and
a token delivered twice, or one missing, is counted exactly. Requests are a pure function of the
workload seed and their index; arrival gaps come from their own seeded generator at whatever
rate the timeline sets (the base load, or a burst).
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass

from loadtest.chaos.spec import WorkloadShape
from loadtest.model import TraceRequest
from loadtest.workloads import synthetic
from wire.text import TokenText


@dataclass(frozen=True, slots=True, kw_only=True)
class ChaosRequest:
    index: int
    slo_class: str
    prompt_tokens: int
    max_tokens: int
    seed: int
    """The engine's text seed: the words this request must receive, in order."""

    def trace(self, arrival_s: float = 0.0) -> TraceRequest:
        return TraceRequest(index=self.index, arrival_s=arrival_s, prompt_tokens=self.prompt_tokens,
                            output_tokens=self.max_tokens, slo_class=self.slo_class)


class RequestFactory:
    """Request `i` of a workload shape: the same for the same seed and index, in any order."""

    def __init__(self, shape: WorkloadShape) -> None:
        self.seed = shape.seed
        self.prompt = synthetic.length_dist(shape.prompt, "workload.prompt")
        self.output = synthetic.length_dist(shape.output, "workload.output")
        names = sorted(shape.class_mix)
        self.classes = names
        self.cumulative = list(itertools.accumulate(shape.class_mix[n] for n in names))

    def make(self, index: int) -> ChaosRequest:
        rng = random.Random(f"chaos:{self.seed}:{index}")  # str seeds are hashed stably (sha512)
        pick = rng.random() * self.cumulative[-1]
        cls = self.classes[min(bisect.bisect_right(self.cumulative, pick), len(self.classes) - 1)]
        return ChaosRequest(index=index, slo_class=cls, prompt_tokens=max(8, self.prompt.sample(rng)),
                            max_tokens=self.output.sample(rng), seed=rng.randrange(1, 2**31))

    def trace(self, rate_rps: float, duration_s: float, seed_offset: int = 0) -> list[TraceRequest]:
        """Poisson arrivals at `rate_rps` for `duration_s` (the simulator's view of the same load)."""
        rng = random.Random(f"arrivals:{self.seed}:{seed_offset}")
        out: list[TraceRequest] = []
        t = rng.expovariate(rate_rps)
        while t < duration_s:
            out.append(self.make(len(out)).trace(t))
            t += rng.expovariate(rate_rps)
        return out


def expected_words(seed: int, count: int) -> list[str]:
    """The words a request with this seed receives, one per token."""
    text = TokenText(seed)
    return [text.next().strip() for _ in range(count)]


def duplicated_tokens(received: Sequence[str], expected: Sequence[str]) -> int:
    """Tokens received after the stream stopped following the expected words (a replay from a
    retry after the first token shows up here: the words start over)."""
    matched = 0
    for got, want in zip(received, expected, strict=False):
        if got != want:
            break
        matched += 1
    return len(received) - matched
