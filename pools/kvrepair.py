"""What the controller does with the router's KV-path verdicts (issue 34; pure, Dynamo-style:
`on_verdicts(state, input) -> (state, effects)`, the clock a value).

Every report carries each prefill -> decode pair's verdict (`pools.kvpaths`). A pair whose
verdict changed is one `VerdictChange` (the controller's `kv_path` event: old, new, measured and
expected GB/s, why). Per request, the router already steers around a bad pair (its avoidance and
probes, `router.plugins.kvpath`): that is the re-pairing. With `action: replace`, a pair that
stays `wrong_path` or `failing` for `after_s` (as the controller saw it) has its decode replica
re-placed (`pools.placement.evict`): once per `cooldown_s` per replica, never one that is
being started, moved or drained, and at most one per pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from pools.kvpaths import AS_PLANNED, BAD, FAILING, SLOW, WRONG_PATH, PairVerdict

Action = Literal["none", "replace"]
Pair = tuple[str, str]


@dataclass(frozen=True, slots=True, kw_only=True)
class KvPathAction:
    """The controller's `kv_path_action` settings."""

    action: Action = "none"
    after_s: float = 120.0
    """A pair judged wrong_path/failing this long has its decode replica re-placed."""
    cooldown_s: float = 600.0
    """A replica re-placed for its path is not re-placed for it again this soon."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RepairState:
    verdicts: Mapping[Pair, str] = field(default_factory=dict)
    """Each pair's last verdict (a pair never reported counts as as_planned)."""
    bad_since: Mapping[Pair, float] = field(default_factory=dict)
    replaced_at: Mapping[str, float] = field(default_factory=dict)
    """Decode replicas re-placed for their path, and when."""


@dataclass(frozen=True, slots=True, kw_only=True)
class VerdictChange:
    verdict: PairVerdict
    old: str
    why: str

    def to_json(self) -> dict[str, object]:
        v = self.verdict
        return {"pair": v.pair, "prefill": v.prefill, "decode": v.decode, "old": self.old, "new": v.verdict,
                "tier": v.tier, "measured_gb_s": v.measured_gb_s, "expected_gb_s": v.expected_gb_s,
                "samples": v.samples, "avoided": v.avoided, "why": self.why}


@dataclass(frozen=True, slots=True, kw_only=True)
class Replacement:
    replica_id: str
    pair: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RepairTick:
    state: RepairState
    changes: tuple[VerdictChange, ...] = ()
    replace: tuple[Replacement, ...] = ()
    waiting: tuple[str, ...] = ()
    """Bad pairs not acted on yet, each with why (for the log and the status view)."""


def explain(v: PairVerdict) -> str:
    """The verdict in words, with its figures."""
    figures = (f"measured {v.measured_gb_s:g} GB/s against {v.expected_gb_s:g} GB/s expected"
               if v.measured_gb_s is not None and v.expected_gb_s is not None else "not measured against its path")
    return {AS_PLANNED: f"{figures}: as planned",
            SLOW: f"{figures}: slow, without a slower link's signature (congestion, or a degraded link)",
            WRONG_PATH: f"{figures}: the signature of a slower link kind than the {v.tier} path planned",
            FAILING: f"transfers failed ({figures})"}.get(v.verdict, figures)


def on_verdicts(state: RepairState, verdicts: Sequence[PairVerdict], now: float, policy: KvPathAction,
                running: frozenset[str], busy: frozenset[str]) -> RepairTick:
    """One pass: the verdict changes and, with `action: replace`, the decode replica to re-place.
    `running`: the replicas serving; `busy`: those being started, moved or drained."""
    changes, seen, bad_since = [], {}, dict(state.bad_since)
    for v in verdicts:
        key = (v.prefill, v.decode)
        old = state.verdicts.get(key, AS_PLANNED)
        seen[key] = v.verdict
        if v.verdict != old:
            changes.append(VerdictChange(verdict=v, old=old, why=explain(v)))
        if v.verdict in BAD:
            bad_since.setdefault(key, now)
        else:
            bad_since.pop(key, None)
    bad_since = {k: t for k, t in bad_since.items() if k in seen}  # a pair no longer followed is forgotten
    replaced = {rid: t for rid, t in state.replaced_at.items() if now - t < policy.cooldown_s}
    out: list[Replacement] = []
    waiting: list[str] = []
    if policy.action == "replace":
        for (prefill, decode), since in sorted(bad_since.items(), key=lambda kv: (kv[1], kv[0])):
            pair = f"{prefill}->{decode}"
            why_not = _held_back(policy, now - since, seen[(prefill, decode)], decode, running, busy, replaced, now)
            if why_not is None and out:
                why_not = "one re-placement per pass"
            if why_not is not None:
                waiting.append(f"{pair}: {why_not}")
                continue
            out.append(Replacement(replica_id=decode, pair=pair, reason=(
                f"KV path {pair} judged {seen[(prefill, decode)]} for {now - since:.0f} s (kv_path_action: replace)")))
            replaced[decode] = now
    new = replace(state, verdicts=seen, bad_since=bad_since, replaced_at=replaced)
    return RepairTick(state=new, changes=tuple(changes), replace=tuple(out), waiting=tuple(waiting))


def _held_back(policy: KvPathAction, held_s: float, verdict: str, decode: str, running: frozenset[str],
               busy: frozenset[str], replaced: Mapping[str, float], now: float) -> str | None:
    """Why a bad pair's decode is not re-placed now; None: it is due."""
    if held_s < policy.after_s:
        return f"{verdict} for {held_s:.0f} s of {policy.after_s:g} s"
    if decode not in running or decode in busy:
        return f"decode {decode} is not serving steadily (being started, moved or drained)"
    if decode in replaced:
        return f"decode {decode} was re-placed {now - replaced[decode]:.0f} s ago (cool-down {policy.cooldown_s:g} s)"
    return None
