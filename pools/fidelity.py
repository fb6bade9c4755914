"""`python -m pools fidelity`: every published point in `pools/data/calibration.yaml` next to what
the cost model predicts for the same conditions (through `pools.cost`, the `cost` command's
answers): published, predicted, ratio (predicted / published, in the published unit), source;
then the summary (share within 25 %, median |log ratio|, the worst three). A point the model
cannot price yet (a model or GPU the catalogue lacks, a bandwidth-only figure, an attainment
curve that needs the simulator's replay) is listed with the reason, never dropped silently.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

from pools import catalog, cost

GPU_ALIASES = {"a100-80gb": "a100-sxm4", "h800": "h800-sxm"}
"""Names the sources use for parts the catalogue lists under another name (LMDeploy's
"A100-80G", form factor unstated, priced as SXM4; Mooncake's H800, SXM)."""
MODEL_ALIASES = {"llama-3.3-70b-instruct": "llama-3.3-70b"}
DTYPES = {"fp16": "bf16", "bf16": "bf16", "fp8": "fp8"}
OPS = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reducescatter", "alltoall": "alltoall",
       "all_to_all": "alltoall"}
"""nccl-tests' binary names (all_reduce_perf, ...) as the cost command names the operations."""
"""FP16 and BF16 run at the same tensor rate on every part in the catalogue."""
WITHIN = 0.25


@dataclass(frozen=True, slots=True)
class Row:
    id: str
    kind: str
    published: float
    unit: str
    predicted: float | None
    source: str
    skipped: str = ""

    @property
    def ratio(self) -> float | None:
        return self.predicted / self.published if self.predicted is not None and self.published else None


def points() -> list[dict[str, Any]]:
    raw = yaml.safe_load(resources.files("pools").joinpath("data/calibration.yaml").read_text())
    found: list[dict[str, Any]] = raw["points"]
    return found


def _names(p: dict[str, Any]) -> tuple[str | None, str | None, str]:
    model = MODEL_ALIASES.get(p.get("model") or "", p.get("model"))
    gpu = GPU_ALIASES.get(p.get("gpu") or "", p.get("gpu"))
    if model is not None and model not in catalog.models():
        return None, None, f"model {model} is not in the catalogue"
    if gpu is not None and gpu not in catalog.gpus():
        return None, None, f"GPU {gpu} is not in the catalogue"
    return model, gpu, ""


BUS_FACTOR = {"allreduce": lambda k: 2 * (k - 1) / k, "allgather": lambda k: (k - 1) / k,
              "reducescatter": lambda k: (k - 1) / k, "alltoall": lambda k: (k - 1) / k}
"""nccl-tests' bus bandwidth = algorithm bandwidth x this (its PERFORMANCE.md)."""


def predict(p: dict[str, Any]) -> tuple[float | None, str]:
    """The model's value for point `p` in the point's unit, or None and why not."""
    model, gpu, why = _names(p)
    if why:
        return None, why
    kind, unit = p["kind"], p["unit"]
    dtype = DTYPES.get(p.get("dtype") or "bf16", "bf16")
    if kind == "prefill" and unit == "ms" and model and gpu:
        return cost.prefill(model, gpu, int(p["tp"]), int(p["tokens"]), int(p.get("context") or 0), dtype)["ms"], ""
    if kind == "decode" and unit == "ms" and model and gpu:
        answer = cost.decode(model, gpu, int(p["tp"]), int(p["batch"]), int(p.get("context") or 0), dtype)
        return answer["ms"], ""
    if kind == "collective":
        op = OPS.get(p["op"], p["op"])
        gbps = p.get("gbps") if p.get("link") in cost.NETWORK else None
        us = cost.collective(op, int(p["bytes"]), int(p["gpus"]), p["link"], gpu, gbps)["us"]
        if unit == "us":
            return us, ""
        if unit in ("GB/s-busbw", "GB/s-algbw") and us > 0:
            algbw = p["bytes"] / (us * 1e-6) / 1e9
            return algbw * (BUS_FACTOR[op](int(p["gpus"])) if unit == "GB/s-busbw" else 1.0), ""
    if kind == "kv" and unit == "ms" and model and p.get("tokens"):
        return cost.kv(model, int(p["tokens"]), p["link"], p.get("gbps"))["ms"], ""
    if kind == "attainment":
        return None, "an attainment curve is replayed through the simulator (not wired yet)"
    return None, f"no prediction for a {kind} point in {unit}"


def rows() -> list[Row]:
    out = []
    for p in points():
        predicted, why = predict(p)
        out.append(Row(p["id"], p["kind"], float(p["value"]), p["unit"], predicted, p["source"], why))
    return out


def summary(found: list[Row]) -> dict[str, Any]:
    priced = [r for r in found if r.ratio is not None and r.ratio > 0]
    logs = [abs(math.log(r.ratio)) for r in priced if r.ratio]
    worst = sorted(priced, key=lambda r: -abs(math.log(r.ratio or 1.0)))[:3]
    return {"points": len(found), "priced": len(priced), "skipped": len(found) - len(priced),
            "within_25pct": sum(1 for r in priced if r.ratio and abs(r.ratio - 1) <= WITHIN) / max(len(priced), 1),
            "median_abs_log_ratio": statistics.median(logs) if logs else None,
            "worst": [{"id": r.id, "ratio": r.ratio} for r in worst]}


def render(found: list[Row]) -> str:
    lines = [f"{'point':<44} {'kind':<10} {'published':>12} {'predicted':>12} {'ratio':>7}  source"]
    for r in found:
        pred = f"{r.predicted:12.4g}" if r.predicted is not None else f"{'-':>12}"
        ratio = f"{r.ratio:7.2f}" if r.ratio is not None else f"{'-':>7}"
        tail = r.source if not r.skipped else f"(skipped: {r.skipped}) {r.source}"
        lines.append(f"{r.id:<44} {r.kind:<10} {r.published:12.4g} {pred} {ratio}  {r.unit}; {tail}")
    s = summary(found)
    median = s["median_abs_log_ratio"]
    lines.append(f"\n{s['priced']} of {s['points']} points priced; within 25%: {s['within_25pct']:.0%}; median |log "
                 f"ratio| {median:.3f}" if median is not None else "\nno point priced")
    lines.append("worst: " + ", ".join(f"{w['id']} x{w['ratio']:.2f}" for w in s["worst"]))
    return "\n".join(lines)
