"""Pickers: the winner among the filtered, scored candidates."""

from __future__ import annotations

import random
from bisect import bisect_right
from collections.abc import Sequence

from router.plugins.model import Candidate, Keyed, Picker
from router.plugins.params import Params

TIE = 1e-9
"""max-score-picker: totals this close are a tie (float sums of the same scores in another order)."""


class MaxScorePicker(Picker):
    """The best total; a tie is broken at random (seeded), so equal replicas share the load."""

    def pick(self, cands: Sequence[Candidate], keyed: Sequence[Keyed], rng: random.Random, turn: int) -> Candidate:
        best = keyed[:bisect_right(keyed, keyed[0][0] + TIE, key=_total)]  # keyed is sorted: the ties lead
        return cands[(rng.choice(best) if len(best) > 1 else best[0])[2]]


class RoundRobinPicker(Picker):
    """The candidates in replica-id order, the `turn`-th (the caller's counter)."""

    def pick(self, cands: Sequence[Candidate], keyed: Sequence[Keyed], rng: random.Random, turn: int) -> Candidate:
        return sorted(cands, key=_replica_id)[turn % len(cands)]


class RandomPicker(Picker):
    def pick(self, cands: Sequence[Candidate], keyed: Sequence[Keyed], rng: random.Random, turn: int) -> Candidate:
        return rng.choice(cands)


def _total(k: Keyed) -> float:
    return k[0]


def _replica_id(c: Candidate) -> str:
    return c.endpoint.replica_id


def max_score(p: Params) -> Picker:
    p.done()
    return MaxScorePicker()


def round_robin(p: Params) -> Picker:
    p.done()
    return RoundRobinPicker()


def random_pick(p: Params) -> Picker:
    p.done()
    return RandomPicker()
