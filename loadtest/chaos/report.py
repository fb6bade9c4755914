"""The chaos run's accounting (pure): every request sorted into exactly one of

    completed   200, every word it asked for, in the seeded order, then [DONE]
    errored     an answer in OpenAI's error shape ({"error": {"message", "type", ...}}): a non-200
                body, or an SSE error event that ends a stream; counted by cause
    hung        no end within the client's deadline
    lost        anything else: a connection dropped without an error, a stream cut short without
                one, an error body that is not OpenAI's, a completion missing words

plus tokens delivered out of order (`duplicated_tokens`: a replay after a retry shows up as the
words starting over), and, per fault, interactive SLO attainment and TTFT before, during and
after it. Times are seconds on the run's clock; latencies are modelled (wall / time scale), as
the engines and the SLO targets count them.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from loadtest.chaos.driver import ChaosRecord
from loadtest.chaos.load import duplicated_tokens, expected_words
from loadtest.summary import percentile
from pools.model import SLOClass

COMPLETED, ERRORED, LOST, HUNG = "completed", "errored", "lost", "hung"


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    bucket: str
    cause: str = ""
    duplicated: int = 0
    tokens: int = 0


def openai_error(body: Any) -> dict[str, Any] | None:
    """The error object when `body` is in OpenAI's shape, else None."""
    if not isinstance(body, dict) or not isinstance(body.get("error"), dict):
        return None
    err = body["error"]
    return err if isinstance(err.get("message"), str) and isinstance(err.get("type"), str) else None


def classify(r: ChaosRecord) -> Verdict:
    expected = expected_words(r.seed, r.max_tokens)
    dup = duplicated_tokens(r.words, expected)
    tokens = len(r.words)
    if r.timed_out:
        return Verdict(bucket=HUNG, cause="no end within the deadline", duplicated=dup, tokens=tokens)
    if r.transport_error:
        return Verdict(bucket=LOST, cause=f"connection: {r.transport_error.split(':')[0]}", duplicated=dup,
                       tokens=tokens)
    err = openai_error(r.error)
    if r.status != 200:
        if err is None:
            return Verdict(bucket=LOST, cause=f"http {r.status} without an OpenAI error body", tokens=tokens)
        return Verdict(bucket=ERRORED, cause=f"http {r.status} {err['type']}", tokens=tokens)
    if r.error is not None:
        if err is None:
            return Verdict(bucket=LOST, cause="stream event not in OpenAI's error shape", duplicated=dup,
                           tokens=tokens)
        return Verdict(bucket=ERRORED, cause=f"stream {err.get('code', '')} {err['type']}".replace("  ", " "),
                       duplicated=dup, tokens=tokens)
    if not r.done:
        return Verdict(bucket=LOST, cause="stream ended without [DONE] or an error", duplicated=dup, tokens=tokens)
    if tokens != r.max_tokens or dup or (r.usage_tokens is not None and r.usage_tokens != r.max_tokens):
        return Verdict(bucket=LOST, cause=f"completion with {tokens} of {r.max_tokens} words in order "
                       f"(usage says {r.usage_tokens})", duplicated=dup, tokens=tokens)
    return Verdict(bucket=COMPLETED, tokens=tokens)


# latencies (modelled)
def ttft_ms(r: ChaosRecord, time_scale: float) -> float | None:
    return None if r.first_token_s is None else r.first_token_s / time_scale * 1000


def tpot_ms(r: ChaosRecord, time_scale: float) -> float | None:
    if r.first_token_s is None or r.last_token_s is None or len(r.words) < 2:
        return None
    return (r.last_token_s - r.first_token_s) / (len(r.words) - 1) / time_scale * 1000


def met_slo(r: ChaosRecord, v: Verdict, cls: SLOClass | None, time_scale: float) -> bool:
    if v.bucket != COMPLETED:
        return False
    ttft, tpot = ttft_ms(r, time_scale), tpot_ms(r, time_scale)
    if cls is None:
        return True
    return ttft is not None and ttft <= cls.ttft_ms and (tpot is None or tpot <= cls.tpot_ms)


def _rounded(x: float) -> float | None:
    return None if math.isnan(x) else round(x, 1)


def stats(mine: Sequence[tuple[ChaosRecord, Verdict]], slo_class: str, classes: Mapping[str, SLOClass],
          time_scale: float) -> dict[str, Any]:
    """One class's requests: attainment (shed and failed requests count as missed), TTFT of the
    completed ones (modelled ms), outcomes."""
    ttfts = [t for r, v in mine if v.bucket == COMPLETED and (t := ttft_ms(r, time_scale)) is not None]
    met = sum(1 for r, v in mine if met_slo(r, v, classes.get(slo_class), time_scale))
    return {"requests": len(mine), "slo_attainment": round(met / len(mine), 4) if mine else None,
            "ttft_p50_ms": _rounded(percentile(ttfts, 50)), "ttft_p99_ms": _rounded(percentile(ttfts, 99)),
            "outcomes": dict(Counter(v.bucket for _, v in mine))}


def window(pairs: Sequence[tuple[ChaosRecord, Verdict]], start_s: float, end_s: float | None, slo_class: str,
           classes: Mapping[str, SLOClass], time_scale: float) -> dict[str, Any]:
    """One class's requests sent in [start_s, end_s)."""
    end = math.inf if end_s is None else end_s
    mine = [(r, v) for r, v in pairs if r.slo_class == slo_class and start_s <= r.sent_s < end]
    return {"from_s": round(start_s, 2), "to_s": None if end_s is None else round(end_s, 2),
            **stats(mine, slo_class, classes, time_scale)}


def _ended(r: ChaosRecord) -> float:
    return math.inf if r.end_s is None else r.end_s


def fault_windows(pairs: Sequence[tuple[ChaosRecord, Verdict]], fault: Mapping[str, Any], window_s: float,
                  classes: Mapping[str, SLOClass], time_scale: float, slo_class: str = "interactive"
                  ) -> dict[str, Any]:
    """before: sent in the window before the fault and over before it; during: in flight when it
    struck, or sent before recovery (or within a window, when it never recovered); after: sent in
    the window from recovery (and, for a drained replica, from the end of its drain)."""
    at, recovered = float(fault["at_s"]), fault.get("recovered_s")
    end = float(recovered) if recovered is not None else at + window_s
    mine = [(r, v) for r, v in pairs if r.slo_class == slo_class]

    def part(keep: Callable[[ChaosRecord], bool], start: float, stop: float) -> dict[str, Any]:
        return {"from_s": round(start, 2), "to_s": round(stop, 2),
                **stats([(r, v) for r, v in mine if keep(r)], slo_class, classes, time_scale)}

    out = {"before": part(lambda r: at - window_s <= r.sent_s < at and _ended(r) < at, at - window_s, at),
           "during": part(lambda r: at <= r.sent_s < end or (r.sent_s < at <= _ended(r)), at, end)}
    if recovered is not None:
        out["after"] = part(lambda r: end <= r.sent_s < end + window_s, end, end + window_s)
    drained = fault.get("drained_s")
    if drained is not None:
        out["after_drain"] = part(lambda r: drained <= r.sent_s < drained + window_s, drained, drained + window_s)
    return out


# whole-run figures
def totals(pairs: Sequence[tuple[ChaosRecord, Verdict]]) -> dict[str, Any]:
    buckets = Counter(v.bucket for _, v in pairs)
    by_cause: dict[str, dict[str, int]] = {}
    for _, v in pairs:
        if v.bucket in (ERRORED, LOST):
            by_cause.setdefault(v.bucket, Counter())[v.cause] += 1
    return {"sent": len(pairs), "completed": buckets[COMPLETED], "errored": buckets[ERRORED],
            "errored_by_cause": dict(sorted(by_cause.get(ERRORED, {}).items())), "lost": buckets[LOST],
            "lost_by_cause": dict(sorted(by_cause.get(LOST, {}).items())), "hung": buckets[HUNG],
            "duplicated_tokens": sum(v.duplicated for _, v in pairs),
            "tokens_delivered": sum(v.tokens for _, v in pairs)}


def shedding(pairs: Sequence[tuple[ChaosRecord, Verdict]], classes: Mapping[str, SLOClass]) -> dict[str, Any]:
    """Who got 429s, when the first came, and whether each said when to come back."""
    shed = sorted((r for r, _ in pairs if r.status == 429), key=lambda r: r.sent_s)
    return {"by_class": dict(sorted(Counter(r.slo_class for r in shed).items())),
            "first": [{"slo_class": r.slo_class, "sent_s": round(r.sent_s, 2)} for r in shed[:3]],
            "without_retry_after": sum(1 for r in shed if not r.retry_after),
            "sheddable_classes": sorted(n for n, c in classes.items() if c.sheddable),
            "first_non_sheddable_s": next((round(r.sent_s, 2) for r in shed
                                           if not (classes.get(r.slo_class) and classes[r.slo_class].sheddable)),
                                          None)}


def memory(samples: Sequence[tuple[float, float, int]], load_end_s: float) -> dict[str, Any]:
    """Router RSS (MB) over the run: (time, rss, requests in flight) samples."""
    if not samples:
        return {"samples": 0}
    rss = [s[1] for s in samples]
    early = [s[1] for s in samples if s[0] <= samples[0][0] + 15] or rss[:1]
    late = [s[1] for s in samples if s[0] >= load_end_s] or rss[-1:]
    return {"samples": len(samples), "start_mb": round(rss[0], 1), "peak_mb": round(max(rss), 1),
            "end_mb": round(rss[-1], 1), "early_max_mb": round(max(early), 1),
            "after_load_mb": round(max(late), 1), "peak_in_flight": max(s[2] for s in samples),
            "series": [[round(t, 1), round(m, 1), n] for t, m, n in samples[:: max(1, len(samples) // 120)]]}


def classified(records: Iterable[ChaosRecord]) -> list[tuple[ChaosRecord, Verdict]]:
    return [(r, classify(r)) for r in records]
