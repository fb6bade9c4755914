"""Proof of the path (issue 34): each prefill/decode pair's KV transfers as measured against what
its path should carry, and a verdict the PD profile acts on. Pure: observations and the clock
come in as values, verdicts and weights go out.

    observed bandwidth  the pair's KV bytes over its measured transfer time (the router's view:
                        prefill done -> decode's first token, less the decode's predicted step)
    expected bandwidth  the path's own, 1 / `kv_route`'s ms per byte (`physics.kvtransfer`)
    raw verdict         failing     a failed transfer in the window
                        wrong_path  ratio below `slow_fraction` and the observed bandwidth within
                                    `signature_tolerance` of a slower link kind's default
                                    (`topology.kinds.DEFAULTS`: TCP speed on an NVLink pair)
                        slow        ratio below `slow_fraction`, no slower kind's signature
                        as_planned  otherwise
    verdict             the raw verdict once it held for `window_s` (hysteresis: one odd window
                        flips nothing); `failing` at once (a failed transfer is a fact)

A `wrong_path`/`failing` pair's predicted transfer is multiplied by `penalty`; once bad for
`avoid_after_s` it is avoided for `cooldown_s`, then one request is let through (a probe) and
its measurement decides: back to normal, or avoided for another cool-down.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pools.kvpaths import AS_PLANNED, BAD, FAILING, SLOW, VERDICTS, WRONG_PATH
from topology.kinds import DEFAULTS, LinkKind

__all__ = ["AS_PLANNED", "BAD", "FAILING", "SLOW", "VERDICTS", "WRONG_PATH", "KvPathRules", "PairState", "classify",
           "measured_ms_per_byte", "observe", "open_to", "probed", "settle", "slower_signature", "weight"]
"""The verdict names are `pools.kvpaths`' (the controller reads them too)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class KvPathRules:
    slow_fraction: float = 0.5
    """Observed bandwidth below this fraction of the path's expected bandwidth is not as planned."""
    signature_tolerance: float = 2.0
    """Observed within this factor (either way) of a slower link kind's bandwidth: that kind's
    signature, so `wrong_path`."""
    window_s: float = 10.0
    """How long a raw verdict must hold before it becomes the pair's verdict."""
    smoothing: float = 0.3
    """Weight of a new measurement in the pair's moving mean of ms per byte."""
    penalty: float = 4.0
    """A `wrong_path`/`failing` pair's predicted KV transfer is multiplied by this."""
    avoid_after_s: float = 20.0
    """Bad this long: the pair is avoided (not chosen while another pair is usable)."""
    cooldown_s: float = 30.0
    """An avoided pair is left alone this long, then one request probes it."""
    noise_ms: float = 5.0
    """A handover within this much of its expected transfer is as planned (the router's view
    includes the decode's queueing and the clocks' jitter)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PairState:
    verdict: str = AS_PLANNED
    raw: str = AS_PLANNED
    raw_since: float = 0.0
    bad_since: float | None = None
    avoided_until: float | None = None
    probing: bool = False
    """The cool-down ended and a probe request was let through; its measurement decides."""
    ms_per_byte: float = 0.0
    """Moving mean of the measured transfer as judged (one within `noise_ms` of its expectation
    counts at the expected rate; 0: not measured yet)."""
    seen_ms_per_byte: float = 0.0
    """Moving mean of the measured transfer as timed, no allowance: what is shown as measured (a
    0.2 ms read of a 40 GB/s path that moved at 4 GB/s is judged as planned, shown at 4)."""
    expected_ms_per_byte: float = 0.0
    ratio: float = 1.0
    """Observed over expected bandwidth, of the moving mean."""
    samples: int = 0


def slower_signature(expected_gb_s: float, observed_gb_s: float, tolerance: float) -> LinkKind | None:
    """The slower link kind whose default bandwidth the observed one matches (closest first)."""
    best: tuple[float, LinkKind] | None = None
    for kind, default in DEFAULTS.items():
        bw = default.bandwidth_gb_s
        if bw <= 0 or bw >= expected_gb_s / tolerance or observed_gb_s <= 0:
            continue
        off = max(observed_gb_s / bw, bw / observed_gb_s)
        if off <= tolerance and (best is None or off < best[0]):
            best = (off, kind)
    return None if best is None else best[1]


def measured_ms_per_byte(expected_ms_per_byte: float, latency_ms: float, kv_bytes: float, transfer_ms: float,
                         rules: KvPathRules) -> float | None:
    """A transfer's measured ms per byte, from its time (the path's set-up `latency_ms` taken
    off, as `kv_route` prices it); the expected rate when it is within `noise_ms` of the
    expectation; None without bytes."""
    if kv_bytes <= 0:
        return None
    if transfer_ms <= expected_ms_per_byte * kv_bytes + latency_ms + rules.noise_ms:
        return expected_ms_per_byte
    return (transfer_ms - latency_ms) / kv_bytes


def seen_ms_per_byte(latency_ms: float, kv_bytes: float, transfer_ms: float) -> float | None:
    """A transfer's ms per byte as timed (the path's set-up `latency_ms` off, never below a
    microsecond); None without bytes."""
    return max(transfer_ms - latency_ms, 1e-3) / kv_bytes if kv_bytes > 0 else None


def classify(expected_ms_per_byte: float, observed_ms_per_byte: float, failed: int, rules: KvPathRules) -> str:
    """One window's raw verdict (module docstring)."""
    if failed > 0:
        return FAILING
    if expected_ms_per_byte <= 0 or observed_ms_per_byte <= 0:
        return AS_PLANNED  # a local handover moves nothing: nothing to judge
    ratio = expected_ms_per_byte / observed_ms_per_byte
    if ratio >= rules.slow_fraction:
        return AS_PLANNED
    expected_gb_s, observed_gb_s = 1e-6 / expected_ms_per_byte, 1e-6 / observed_ms_per_byte
    found = slower_signature(expected_gb_s, observed_gb_s, rules.signature_tolerance)
    return WRONG_PATH if found is not None else SLOW


def observe(state: PairState, *, now: float, expected_ms_per_byte: float, observed_ms_per_byte: float | None,
            failed: int, rules: KvPathRules, seen_ms_per_byte: float | None = None) -> PairState:
    """The pair's state after one measurement (`observed_ms_per_byte` None: failures only;
    `seen_ms_per_byte`: the same measurement without the noise allowance, else the observed)."""
    mean, seen = state.ms_per_byte, state.seen_ms_per_byte
    if observed_ms_per_byte is not None and observed_ms_per_byte > 0:
        fresh = not mean or state.probing  # a probe's measurement stands alone
        timed = seen_ms_per_byte if seen_ms_per_byte is not None and seen_ms_per_byte > 0 else observed_ms_per_byte
        mean = observed_ms_per_byte if fresh else (1 - rules.smoothing) * mean + rules.smoothing * observed_ms_per_byte
        seen = timed if fresh or not seen else (1 - rules.smoothing) * seen + rules.smoothing * timed
    raw = classify(expected_ms_per_byte, mean, failed, rules)
    ratio = expected_ms_per_byte / mean if mean and expected_ms_per_byte else 1.0
    measured = replace(state, raw=raw, raw_since=state.raw_since if raw == state.raw else now, probing=False,
                       ms_per_byte=mean, seen_ms_per_byte=seen, expected_ms_per_byte=expected_ms_per_byte, ratio=ratio,
                       samples=state.samples + (observed_ms_per_byte is not None))
    return settle(measured, now, rules, decided=state.probing)  # a probe's measurement decides at once


def settle(state: PairState, now: float, rules: KvPathRules, *, decided: bool = False) -> PairState:
    """The verdict once the raw one held for `window_s` (at once when `decided` or failing),
    whether new measurements came or not: a pair the choice left alone keeps its last evidence.
    A bad verdict held for `avoid_after_s` avoids the pair for `cooldown_s`; a probe's bad
    measurement (`decided`) for another cool-down; a good verdict ends the avoidance."""
    verdict = state.raw if decided or state.raw == FAILING or now - state.raw_since >= rules.window_s else state.verdict
    if verdict not in BAD:
        bad_since, avoided = None, None
    else:
        bad_since = state.bad_since if state.bad_since is not None else now
        avoided = state.avoided_until
        if decided or (avoided is None and now - bad_since >= rules.avoid_after_s):
            avoided = now + rules.cooldown_s
    if (verdict, bad_since, avoided) == (state.verdict, state.bad_since, state.avoided_until):
        return state
    return replace(state, verdict=verdict, bad_since=bad_since, avoided_until=avoided)


def open_to(state: PairState, now: float) -> bool:
    """Whether the pair may be chosen now: an avoided pair is not until its cool-down ends; then
    once (a probe, `probed`) until the probe's measurement comes back (`observe`)."""
    return state.avoided_until is None or (now >= state.avoided_until and not state.probing)


def probed(state: PairState) -> PairState:
    """The state after a request was sent over the pair: an avoided pair's probe is out."""
    return state if state.avoided_until is None else replace(state, probing=True)


def weight(state: PairState, rules: KvPathRules) -> float:
    """Multiplier on the pair's predicted KV transfer."""
    return rules.penalty if state.verdict in BAD else 1.0
