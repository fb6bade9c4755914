"""Routing decisions: pure functions of a snapshot, in llm-d's shape — a profile's filters, its
weighted scorers in [0, 1] and its picker, each a plugin named in config (`router.plugins`).
The live router and the offline simulator call the same functions; a decision is a
`RouteDecision` value that names every candidate's scores. PD (whether to split a request, and
the pair) is the PD profile, `router.plugins.pd`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from router.plugins.filters import usable_of
from router.plugins.model import Candidate, Filter, Keyed, Ranked, RouteRequest, Scorer
from router.plugins.profile import Profile
from router.plugins.timing import PluginTimer

__all__ = ["RANKED_KEEP", "RouteDecision", "decide"]

RANKED_KEEP = 16
"""A decision names this many best candidates with their scores (retries and logs use the top)."""


class RouteDecision:
    """One routing decision: the winner and, on demand, the ranked candidates with each scorer's
    score (computed only when someone looks: a log line, a test, the admin API)."""

    __slots__ = ("_cands", "_keyed", "_plugins", "_ranked", "_req", "reason", "winner")

    def __init__(self, winner: Candidate | None, reason: str, cands: Sequence[Candidate] = (),
                 keyed: Sequence[Keyed] = (), plugins: Sequence[tuple[str, Scorer, float]] = (),
                 req: RouteRequest | None = None) -> None:
        self.winner, self.reason = winner, reason
        self._cands, self._keyed, self._plugins, self._req = cands, keyed, plugins, req
        self._ranked: tuple[Ranked, ...] | None = None

    @property
    def ranked(self) -> tuple[Ranked, ...]:
        """The best RANKED_KEEP candidates, best first, with their per-scorer scores."""
        if self._ranked is None:
            req, cands = self._req, self._cands
            each = {name: s.scores(req, cands) for name, s, _ in self._plugins} if req else {}
            self._ranked = tuple(
                Ranked(rid, -neg, {name: scores[i] for name, scores in each.items()}, cands[i])
                for neg, rid, i in self._keyed[:RANKED_KEEP])
        return self._ranked

    def log_line(self) -> str:
        parts = " ".join(f"{r.replica_id}={r.total:.3f}" for r in self.ranked[:6])
        return f"route -> {self.winner.endpoint.replica_id if self.winner else 'none'} ({self.reason}) [{parts}]"

    def order(self) -> list[Candidate]:
        """Replicas to try: the winner, then the rest best first (retries before the first byte)."""
        if self.winner is None:
            return []
        won, cands = self.winner.endpoint.replica_id, self._cands
        return [self.winner, *(cands[i] for _, rid, i in self._keyed[:RANKED_KEEP] if rid != won)]


def decide(req: RouteRequest, candidates: Sequence[Candidate], profile: Profile, rng: random.Random,
           turn: int = 0, timer: PluginTimer | None = None) -> RouteDecision:
    """Filter, score, pick. `turn` is the round-robin position (the caller's counter); `timer`,
    when given, times one decision in its `every`, plugin by plugin (the same decision)."""
    if timer is not None and timer.due():
        return _decide_timed(req, candidates, profile, rng, turn, timer)
    if profile.usable_only:
        cands = usable_of(req, candidates, req.role or "mixed")
    else:
        cands = _filtered(req, candidates, profile.filter_fns)
    if not cands:
        return _nothing_left(req, candidates, profile)
    plugins = profile.scorer_plugins
    if len(plugins) == 1:
        _, scorer, weight = plugins[0]
        scores = scorer.scores(req, cands)
        keyed = [(-weight * score, endpoint.replica_id, i)
                 for i, score, (endpoint, _) in zip(range(len(cands)), scores, cands, strict=True)]
    else:  # each scorer over all candidates (a scorer may compare them: `Scorer.scores`)
        totals = [0.0] * len(cands)
        for _, scorer, weight in plugins:
            for i, score in enumerate(scorer.scores(req, cands)):
                totals[i] += weight * score
        keyed = [(-totals[i], c.endpoint.replica_id, i) for i, c in enumerate(cands)]
    keyed.sort()  # best first; ties by replica id
    winner = profile.picker_plugin.pick(cands, keyed, rng, turn)
    return RouteDecision(winner, f"{profile.picker} of {len(cands)}", cands, keyed, plugins, req)


def _filtered(req: RouteRequest, candidates: Sequence[Candidate], filters: tuple[Filter, ...]) -> list[Candidate]:
    """The model's candidates that every filter keeps, in one pass."""
    model = req.model
    return [c for c in candidates if c.endpoint.model == model and all(f.keep(req, c) for f in filters)]


def _nothing_left(req: RouteRequest, candidates: Sequence[Candidate], profile: Profile) -> RouteDecision:
    """Which filter left no replica (the filters again, one at a time)."""
    model = req.model
    cands = [c for c in candidates if c.endpoint.model == model]
    if not cands:
        return RouteDecision(None, f"no replica serves {req.model}")
    for name, f in profile.filter_plugins:
        cands = f.filter(req, cands)
        if not cands:
            return RouteDecision(None, f"{name} left no replica")
    return RouteDecision(None, "no replica left")


def _decide_timed(req: RouteRequest, candidates: Sequence[Candidate], profile: Profile, rng: random.Random,
                  turn: int, timer: PluginTimer) -> RouteDecision:
    """`decide`, stage by stage, each plugin's stage timed: the same filters, the same sums in the
    same order, the same picker, so the same decision."""
    clock = timer.clock
    model = req.model
    cands = [c for c in candidates if c.endpoint.model == model]
    if not cands:
        return RouteDecision(None, f"no replica serves {req.model}")
    for name, f in profile.filter_plugins:
        t0 = clock()
        cands = f.filter(req, cands)
        timer.record("filter", name, clock() - t0)
        if not cands:
            return RouteDecision(None, f"{name} left no replica")
    plugins = profile.scorer_plugins
    totals = [0.0] * len(cands)
    for name, scorer, weight in plugins:
        t0 = clock()
        for i, score in enumerate(scorer.scores(req, cands)):
            totals[i] += weight * score
        timer.record("scorer", name, clock() - t0)
    keyed = [(-totals[i], c.endpoint.replica_id, i) for i, c in enumerate(cands)]
    keyed.sort()
    t0 = clock()
    winner = profile.picker_plugin.pick(cands, keyed, rng, turn)
    timer.record("picker", profile.picker, clock() - t0)
    return RouteDecision(winner, f"{profile.picker} of {len(cands)}", cands, keyed, plugins, req)
