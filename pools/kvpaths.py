"""Proof of the path (issue 34), as the router tells the controller: each prefill -> decode pair's
KV-path verdict (`router.plugins.kvpath` judges it; the names live here because router and
controller both speak them) with the bandwidth measured against the path's own.

It travels in the router's load report (`pools.autoscale.report.LoadReport.kv_paths`) every
second; `verdicts_from_json` checks every field on the way in, as the rest of the report is.

    {"prefill": REPLICA, "decode": REPLICA, "verdict": "as_planned|slow|wrong_path|failing",
     "tier": TIER, "measured_gb_s": float|null, "expected_gb_s": float|null, "samples": int,
     "avoided": bool}
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

AS_PLANNED, SLOW, WRONG_PATH, FAILING = "as_planned", "slow", "wrong_path", "failing"
VERDICTS = (AS_PLANNED, SLOW, WRONG_PATH, FAILING)
BAD = frozenset((WRONG_PATH, FAILING))
MAX_PAIRS = 4096
"""Pairs in one report: the router follows at most `pd.kv_path.max_pairs` (at most 4096)."""
_KEYS = frozenset(("prefill", "decode", "verdict", "tier", "measured_gb_s", "expected_gb_s", "samples", "avoided"))


@dataclass(frozen=True, slots=True, kw_only=True)
class PairVerdict:
    prefill: str
    decode: str
    verdict: str
    tier: str = "-"
    measured_gb_s: float | None = None
    """The pair's moving mean (None: not measured yet)."""
    expected_gb_s: float | None = None
    """What its path should carry (`router.plugins.pd.kv_route`; None: a local handover)."""
    samples: int = 0
    avoided: bool = False
    """The router does not choose the pair now (`router.plugins.kvpath.open_to`)."""

    @property
    def pair(self) -> str:
        return f"{self.prefill}->{self.decode}"

    def to_json(self) -> dict[str, Any]:
        return {"prefill": self.prefill, "decode": self.decode, "verdict": self.verdict, "tier": self.tier,
                "measured_gb_s": self.measured_gb_s, "expected_gb_s": self.expected_gb_s, "samples": self.samples,
                "avoided": self.avoided}


def verdicts_from_json(raw: Any) -> tuple[PairVerdict, ...]:
    """The report's `kv_paths` list, every field checked; ValueError when it is not one."""
    if not isinstance(raw, list) or len(raw) > MAX_PAIRS:
        raise ValueError(f"kv_paths must be a list of at most {MAX_PAIRS} pairs")
    return tuple(_verdict(i, doc) for i, doc in enumerate(raw))


def _verdict(i: int, doc: Any) -> PairVerdict:
    where = f"kv_paths[{i}]"
    if not isinstance(doc, dict):
        raise ValueError(f"{where} must be an object")
    unknown = set(doc) - _KEYS
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
    verdict = doc.get("verdict")
    if verdict not in VERDICTS:
        raise ValueError(f"{where}.verdict must be one of {', '.join(VERDICTS)} (got {verdict!r})")
    samples, avoided = doc.get("samples", 0), doc.get("avoided", False)
    if isinstance(samples, bool) or not isinstance(samples, int) or not 0 <= samples <= 1 << 53:
        raise ValueError(f"{where}.samples must be a whole number between 0 and 2**53")
    if not isinstance(avoided, bool):
        raise ValueError(f"{where}.avoided must be true or false")
    return PairVerdict(prefill=bounded_name(doc.get("prefill"), f"{where}.prefill"),
                       decode=bounded_name(doc.get("decode"), f"{where}.decode"), verdict=verdict,
                       tier=bounded_name(doc.get("tier") or "-", f"{where}.tier"),
                       measured_gb_s=_rate(doc.get("measured_gb_s"), f"{where}.measured_gb_s"),
                       expected_gb_s=_rate(doc.get("expected_gb_s"), f"{where}.expected_gb_s"),
                       samples=samples, avoided=avoided)


def bounded_name(value: Any, what: str) -> str:
    """A name as reports carry them (replica ids, pools, tiers): ValueError unless a short string."""
    if not isinstance(value, str) or not 0 < len(value) <= 256:
        raise ValueError(f"{what} must be a non-empty string of at most 256 characters")
    return value


def _rate(value: Any, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 <= value <= 1e7:
        raise ValueError(f"{what} must be null or a finite number of GB/s between 0 and 1e7 (got {value!r})")
    return float(value)
