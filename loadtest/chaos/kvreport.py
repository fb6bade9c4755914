"""What a KV-path fault of the chaos run shows (pure), read off the router's verdicts as the
observer recorded them, the fault's record and the requests (`x-isle-prefill-replica` and
`x-isle-replica` name each PD request's pair):

    time_to_flag_s      from the strike to the router's first verdict other than as_planned
    time_to_avoid_s     ... to the router avoiding the pair (not chosen while another is usable)
    time_to_leave_s     ... to the last request sent over the pair before that (the router prices
                        each pair at its measured rate, so traffic may leave before the verdict)
    share_on_pair       the pair's share of the PD requests sent in each window
    ttft_on_pair        TTFT (modelled ms, every class) of the requests the pair served, in the
                        no-fault window and during the fault: what the fault cost those it hit
    interactive         interactive TTFT (modelled ms) in each window:
        no_fault        the run's quiet window before its first fault (requests over before it)
        during          sent from the strike until the pair was avoided (or the watch ended)
        after           sent in the `window_s` from then, the fault still on
    ttft_p99_ratio      after p99 over no_fault p99
    ..._vs_reference    after p99 over the same window's p99 in a no-fault run of the same spec
                        and seed (`--reference`): the same requests at the same times

"The no-fault run": by default the same run's quiet window before any fault (after `warmup_s`),
so one run proves the point. Its requests are not those of the after window, though: the seeded
workload has clumps of long prompts, the same requests in every run of a seed, and a 120 s window
with one has a p99 20-30 % above one without. A no-fault run of the same spec and seed
(`--no-faults SECONDS`, then `--reference DIR`) sends the same requests at the same times, so
its after window differs from the faulted run's by the fault and the machine's noise alone;
with a reference, the check uses that ratio.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from loadtest.chaos.driver import ChaosRecord
from loadtest.chaos.report import Verdict, stats, ttft_ms
from loadtest.summary import percentile
from pools.model import SLOClass

FLAG_WITHIN_S = 30.0
"""The router must flag a pair whose KV falls back to TCP within this many seconds."""
RECOVERED_WITHIN = 0.10
"""Interactive TTFT p99 once the pair is avoided: at most this much above the no-fault window's."""
MOVED_OFF_SHARE = 0.05
"""Once avoided, the pair keeps at most this share of PD requests (the router's probe after each
cool-down goes over it)."""
INTERACTIVE = "interactive"
KV_KINDS = ("kv_transport_fallback", "kv_remote_nic")


def first_kv(changes: Sequence[Mapping[str, Any]], after_s: float, pair: str,
             what: Callable[[Mapping[str, Any]], bool]) -> tuple[float, Mapping[str, Any]] | None:
    """When the recorded verdicts first showed `pair`'s row satisfying `what`, at or after
    `after_s`, and that row (None: never)."""
    for c in changes:
        row = c["pairs"].get(pair)
        if c["at_s"] >= after_s and row is not None and what(row):
            return float(c["at_s"]), row
    return None


def _ended(r: ChaosRecord) -> float:
    return math.inf if r.end_s is None else r.end_s


def share_on_pair(pairs: Sequence[tuple[ChaosRecord, Verdict]], prefill: str, decode: str, start_s: float,
                  end_s: float) -> dict[str, Any]:
    """The pair's share of the PD requests sent in [start_s, end_s)."""
    pd = [r for r, _ in pairs if r.prefill_replica and start_s <= r.sent_s < end_s]
    on = sum(1 for r in pd if (r.prefill_replica, r.replica) == (prefill, decode))
    return {"pd_requests": len(pd), "on_pair": on, "share": round(on / len(pd), 4) if pd else None}


def kv_windows(fault: Mapping[str, Any], baseline: tuple[float, float], window_s: float
               ) -> dict[str, tuple[float, float]]:
    """The fault's windows on the run clock (module docstring)."""
    at = float(fault["at_s"])
    settled = fault.get("avoided_s")
    settled = float(settled) if settled is not None else float(fault.get("watched_until_s") or at)
    return {"no_fault": baseline, "during": (at, settled), "after": (settled, settled + window_s)}


def kv_details(pairs: Sequence[tuple[ChaosRecord, Verdict]], fault: Mapping[str, Any], baseline: tuple[float, float],
               window_s: float, classes: Mapping[str, SLOClass], time_scale: float,
               reference: Sequence[tuple[ChaosRecord, Verdict]] | None = None) -> dict[str, Any]:
    """The fault's figures (module docstring); `baseline`: the run's quiet window before its first
    fault; `reference`: a no-fault run's requests, same spec and seed."""
    at = float(fault["at_s"])
    windows = kv_windows(fault, baseline, window_s)
    prefill, decode = str(fault["prefill"]), str(fault["decode"])
    interactive: dict[str, Any] = {}
    for name, (start, end) in windows.items():
        mine = [(r, v) for r, v in pairs if r.slo_class == INTERACTIVE and start <= r.sent_s < end
                and (name != "no_fault" or _ended(r) < end)]  # the no-fault window: over before any fault
        interactive[name] = {"from_s": round(start, 2), "to_s": round(end, 2),
                             **stats(mine, INTERACTIVE, classes, time_scale)}
    base, after = interactive["no_fault"]["ttft_p99_ms"], interactive["after"]["ttft_p99_ms"]
    on_pair = [r.sent_s for r, _ in pairs if (r.prefill_replica, r.replica) == (prefill, decode)
               and at <= r.sent_s < windows["during"][1]]
    last = max(on_pair) if on_pair else None
    served = {name: [r for r, v in pairs if (r.prefill_replica, r.replica) == (prefill, decode)
                     and windows[name][0] <= r.sent_s < windows[name][1]] for name in ("no_fault", "during")}
    return {"time_to_flag_s": _since(fault.get("flagged_s"), at), "time_to_avoid_s": _since(fault.get("avoided_s"), at),
            "time_to_leave_s": _since(last, at), "last_request_on_pair_s": None if last is None else round(last, 2),
            "share_on_pair": {name: share_on_pair(pairs, prefill, decode, *w) for name, w in windows.items()},
            "ttft_on_pair": {name: _ttfts(rs, time_scale) for name, rs in served.items()},
            "interactive": interactive,
            "ttft_p99_ratio": round(after / base, 3) if base and after is not None else None,
            **(_against(reference, windows["after"], after, classes, time_scale) if reference is not None else {})}


def _against(reference: Sequence[tuple[ChaosRecord, Verdict]], window: tuple[float, float], after: float | None,
             classes: Mapping[str, SLOClass], time_scale: float) -> dict[str, Any]:
    """The after window in the reference run, and the after p99 over it."""
    start, end = window
    mine = [(r, v) for r, v in reference if r.slo_class == INTERACTIVE and start <= r.sent_s < end]
    there = {"from_s": round(start, 2), "to_s": round(end, 2), **stats(mine, INTERACTIVE, classes, time_scale)}
    p99 = there["ttft_p99_ms"]
    return {"reference_after": there,
            "ttft_p99_ratio_vs_reference": round(after / p99, 3) if p99 and after is not None else None}


def recorded(rows: Iterable[Mapping[str, Any]]) -> list[tuple[ChaosRecord, Verdict]]:
    """A run's requests.jsonl rows as classified records (a reference run's: the words are not
    kept there, so each keeps the verdict it was given)."""
    names = {f.name for f in dataclasses.fields(ChaosRecord)} - {"words"}
    return [(ChaosRecord(**{k: row[k] for k in names if k in row}),
             Verdict(bucket=str(row["verdict"]), cause=str(row.get("cause", "")),
                     duplicated=int(row.get("duplicated", 0)), tokens=int(row.get("tokens", 0)))) for row in rows]


def _ttfts(records: Sequence[ChaosRecord], time_scale: float) -> dict[str, Any]:
    ms = [t for r in records if (t := ttft_ms(r, time_scale)) is not None]
    return {"requests": len(ms), "ttft_p50_ms": round(percentile(ms, 50), 1) if ms else None,
            "ttft_max_ms": round(max(ms), 1) if ms else None}


def _since(t: Any, t0: float) -> float | None:
    return None if t is None else round(float(t) - t0, 2)


def kv_checks(fault: Mapping[str, Any]) -> dict[str, bool]:
    """The fault's checks, named after its kind: flagged within `FLAG_WITHIN_S`, traffic off the
    pair, interactive TTFT p99 after within `RECOVERED_WITHIN` of the no-fault window's. The
    transport fallback must pass all three. A remote NIC at half rate sits on the router's own line
    (slow below half the expected bandwidth, `router.plugins.kvpath`) and on an NVLink pair costs
    less than the router's `noise_ms`: whether it is flagged is reported, and only a flagged one is
    held to the other two (unflagged, its TTFT windows measure the machine, not the fault)."""
    kind, d = str(fault["kind"]), fault.get("details") or {}
    done = not fault.get("error") and bool(d)
    flag = d.get("time_to_flag_s")
    if kind != "kv_transport_fallback" and flag is None:
        return {}
    share = d.get("share_on_pair", {})
    before, after = share.get("no_fault", {}).get("share"), share.get("after", {}).get("share")
    ratio = d.get("ttft_p99_ratio_vs_reference", d.get("ttft_p99_ratio"))  # the reference's, when there is one
    return {f"{kind}_flagged_within_30s": bool(done and flag is not None and flag <= FLAG_WITHIN_S),
            f"{kind}_traffic_moves_off_pair": bool(done and fault.get("avoided_s") is not None and before
                                                   and after is not None and after <= MOVED_OFF_SHARE),
            f"{kind}_interactive_ttft_p99_recovers": bool(done and ratio is not None
                                                          and ratio <= 1.0 + RECOVERED_WITHIN)}


def kv_progress(record: Mapping[str, Any]) -> str:
    """What the router did about the pair, as the run goes on."""
    pair, flagged, avoided = record.get("pair"), record.get("flagged_s"), record.get("avoided_s")
    if flagged is None:
        return f"the router did not flag {pair}"
    then = "did not avoid it" if avoided is None else f"avoided it at {avoided:.0f} s"
    return f"the router flagged {pair} at {flagged:.0f} s and {then}"


def kv_summary(f: Mapping[str, Any]) -> str:
    """One line for the run's printed summary."""
    d, share = f.get("details") or {}, (f.get("details") or {}).get("share_on_pair", {})
    ttft = d.get("interactive", {})

    def pct(w: str) -> str:
        s = share.get(w, {}).get("share")
        return "-" if s is None else f"{s:.0%}"

    def p99(w: str) -> str:
        v = ttft.get(w, {}).get("ttft_p99_ms")
        return "-" if v is None else f"{v:.0f}"

    return (f"{f['kind']} {f.get('pair')}: flagged after {d.get('time_to_flag_s')} s ({f.get('flag_verdict')}), "
            f"avoided after {d.get('time_to_avoid_s')} s, last request over it {d.get('time_to_leave_s')} s after "
            f"the fault; share of PD requests on the pair no-fault/during/after "
            f"{pct('no_fault')} / {pct('during')} / {pct('after')}; interactive TTFT p99 {p99('no_fault')} / "
            f"{p99('during')} / {p99('after')} ms (after / no-fault {d.get('ttft_p99_ratio')}"
            + (f"; the same window in the reference run {d['reference_after']['ttft_p99_ms']} ms, after / it "
               f"{d['ttft_p99_ratio_vs_reference']}" if "reference_after" in d else "") + ")"
            + (f"; error: {f['error']}" if f.get("error") else ""))
