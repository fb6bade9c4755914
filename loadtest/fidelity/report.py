"""`python -m pools fidelity`: every published point in `physics/data/calibration.yaml` next to what
the cost model predicts for the same conditions (through `physics.queries`, the `cost` command's
answers): published, predicted, ratio (predicted / published, in the published unit), source;
then the summary (share within 25 %, median |log ratio|, the worst three). An SLO attainment
point is priced by replaying its benchmark through the simulated engine (`loadtest.fidelity.replay`) and
judged by absolute difference instead (within 0.1 of the published share). A point the model
cannot price yet (a model or GPU the catalogue lacks, a bandwidth-only figure, an attainment
curve with no replayable workload) is listed with the reason, never dropped silently.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

from loadtest.fidelity.replay.closedloop import closed_loop_itl_ms
from loadtest.fidelity.replay.distserve import predicted_attainment
from loadtest.fidelity.replay.sharegpt import SOURCE
from physics import catalog, moecost
from physics import queries as cost

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
"""Ratio kinds: within when |predicted / published - 1| <= this."""
ABS_WITHIN = {"attainment": 0.1}
"""Kinds judged by |predicted - published| in their unit instead of by ratio: an SLO attainment is
a share of requests (0.45 against 0.55 is 10 points of 100, not 18 %)."""


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

    @property
    def absolute(self) -> bool:
        """Judged by absolute difference (`ABS_WITHIN`), not by ratio."""
        return self.kind in ABS_WITHIN

    @property
    def within(self) -> bool | None:
        """Within its kind's tolerance; None when not priced."""
        if self.predicted is None:
            return None
        if self.absolute:
            return abs(self.predicted - self.published) <= ABS_WITHIN[self.kind] + 1e-9
        return self.ratio is not None and self.ratio > 0 and abs(self.ratio - 1) <= WITHIN

    @property
    def tolerance(self) -> str:
        return f"+-{ABS_WITHIN[self.kind]:g} abs" if self.absolute else f"+-{WITHIN:.0%}"


def points() -> list[dict[str, Any]]:
    raw = yaml.safe_load(resources.files("physics").joinpath("data/calibration.yaml").read_text())
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
    if p.get("excluded"):
        return None, f"excluded: {p['excluded']}"
    model, gpu, why = _names(p)
    if why:
        return None, why
    kind, unit = p["kind"], p["unit"]
    dtype = DTYPES.get(p.get("dtype") or "bf16", "bf16")
    if kind == "prefill" and unit == "ms" and model and gpu:
        return cost.prefill(model, gpu, int(p["tp"]), int(p["tokens"]), int(p.get("context") or 0), dtype)["ms"], ""
    if kind == "pd-ttft" and unit == "ms" and model and gpu:
        return pd_ttft_ms(p, model, gpu, dtype), ""
    if kind == "decode" and unit == "ms" and model and gpu and int(p.get("concurrency") or 1) > 1:
        if not p.get("prompt_tokens") or not p.get("output_tokens"):
            return None, "a loaded-system ITL needs prompt_tokens and output_tokens to replay its closed loop"
        return closed_loop_itl_ms(model, gpu, int(p["tp"]), int(p["concurrency"]), int(p["prompt_tokens"]),
                                         int(p["output_tokens"]), dtype, p.get("link") or "nvswitch"), ""
    if kind == "decode" and unit in ("ms", "tokens/s") and model and gpu:
        answer = cost.decode(model, gpu, int(p["tp"]), int(p["batch"]), int(p.get("context") or 0), dtype)
        return (answer["ms"] if unit == "ms" else 1000.0 / answer["ms"]), ""
    if kind == "collective":
        op = OPS.get(p["op"], p["op"])
        gbps = p.get("gbps") if p.get("link") in cost.NETWORK else None
        us = cost.collective(op, int(p["bytes"]), int(p["gpus"]), p["link"], gpu, gbps,
                             nvls=p.get("nvls", True) is not False)["us"]
        if unit == "us":
            return us, ""
        if unit in ("GB/s-busbw", "GB/s-algbw") and us > 0:
            algbw = p["bytes"] / (us * 1e-6) / 1e9
            return algbw * (BUS_FACTOR[op](int(p["gpus"])) if unit == "GB/s-busbw" else 1.0), ""
    if kind == "kv" and unit == "ms" and model and p.get("tokens"):
        return cost.kv(model, int(p["tokens"]), p["link"], p.get("gbps"), int(p.get("tp") or 1))["ms"], ""
    if kind == "kv" and unit == "GB/s" and p.get("bytes") and p.get("rails"):
        return cost.kv_payload_gb_s(float(p["bytes"]), p["link"], p.get("gbps"), int(p["rails"])), ""
    if kind == "a2a" and gpu:
        answer = cost.a2a(gpu, int(p["ep"]), int(p["tokens"]), int(p["hidden"]), int(p["topk"]), p["dtype"],
                          p["mode"], p.get("link") or "rdma", int(p.get("gpus_per_node") or 8),
                          p.get("gbps") if p.get("link") != "nvlink" else None,
                          int(p.get("groups_per_token") or 0))
        if unit == "us":
            return answer["us"], ""
        if unit == "GB/s-bottleneck":
            return a2a_bottleneck_gb_s(p, answer["us"]), ""
    if kind == "moe" and unit == "tokens/s-per-node" and model and gpu:
        phase = p["phase"]
        answer = cost.moe(model, gpu, int(p.get("tp") or 1), int(p["dp"]), phase, p.get("link") or "rdma",
                          tokens=int(p.get("tokens") or 0), prompts=int(p.get("prompts") or 1),
                          batch=int(p.get("batch") or 0), context=int(p.get("context") or 0),
                          domain_gpus=int(p.get("gpus_per_node") or 8), gbps=p.get("gbps"),
                          overlap=bool(p.get("overlap")))
        return answer["tokens_per_s_per_gpu"] * int(p.get("gpus_per_node") or 8), ""
    if kind == "attainment" and unit == "fraction" and model and gpu:
        if not str(p.get("source", "")).startswith(SOURCE) or "rate_rps" not in p:
            return None, "no replayable workload for this attainment point (loadtest.fidelity.replay has DistServe's)"
        return predicted_attainment(model, gpu, int(p.get("tp") or 1), float(p["rate_rps"])), ""
    return None, f"no prediction for a {kind} point in {unit}"


def a2a_bottleneck_gb_s(p: dict[str, Any], us: float) -> float:
    """DeepEP's normal-kernel bottleneck bandwidth as this model counts the bytes: inside a node
    the share sent to NVLink peers; across nodes a token once per remote node it touches."""
    ep, tokens, hidden, topk = int(p["ep"]), int(p["tokens"]), int(p["hidden"]), int(p["topk"])
    element = moecost.FP8_DISPATCH_BYTES if p["dtype"] == "fp8" else 2.0
    per_node = int(p.get("gpus_per_node") or 8)
    if ep <= per_node:
        moved = tokens * topk * hidden * element * (ep - 1) / ep
    else:
        moved = tokens * hidden * element * moecost.remote_domains(ep // per_node, topk,
                                                                    int(p.get("groups_per_token") or 0))
    return moved / (us * 1e-6) / 1e9


VLLM_PD_PATH_MS = 35.0
"""What vLLM's disaggregated path adds to prefill + KV transfer + the first decode step when a
benchmark measures TTFT through its toy proxy (two HTTP hops, the decode's wait for the
connector to report the KV in, two engine loops at TP8): the 128-token row of MOONCAKE-PD (46.09
ms) less the model's 11.1 ms for those three. A property of the measured system, not of
isleserve's router (which claims the KV itself, priced by `python -m router bench`): only the
pd-ttft points use it; the longer rows test the rest of the model."""


def pd_ttft_ms(p: dict[str, Any], model: str, gpu: str, dtype: str) -> float:
    """A disaggregated TTFT: the prefill on the prefill replica, its KV over the network to the
    decode replica (each TP rank over its own NIC), the decode's first step, and the measured
    system's PD path (`VLLM_PD_PATH_MS`)."""
    tp, tokens = int(p["tp"]), int(p["tokens"])
    pre = cost.prefill(model, gpu, tp, tokens, 0, dtype)["ms"]
    kv = cost.kv(model, tokens, p.get("link") or "rdma", p.get("gbps"), tp)["ms"]
    first = cost.decode(model, gpu, tp, 1, tokens, dtype)["ms"]
    return float(pre + kv + first + VLLM_PD_PATH_MS)


def rows() -> list[Row]:
    out = []
    for p in points():
        predicted, why = predict(p)
        out.append(Row(p["id"], p["kind"], float(p["value"]), p["unit"], predicted, p["source"], why))
    return out


def summary(found: list[Row]) -> dict[str, Any]:
    """Ratio kinds: share within 25 %, median |log ratio|, the worst three; each absolute kind
    (`ABS_WITHIN`): its tolerance, how many are within it, the largest |difference|."""
    priced = [r for r in found if not r.absolute and r.ratio is not None and r.ratio > 0]
    logs = [abs(math.log(r.ratio)) for r in priced if r.ratio]
    worst = sorted(priced, key=lambda r: -abs(math.log(r.ratio or 1.0)))[:3]
    absolute: dict[str, dict[str, Any]] = {}
    for kind, tol in ABS_WITHIN.items():
        rows = [r for r in found if r.kind == kind and r.predicted is not None]
        diffs = [abs((r.predicted or 0.0) - r.published) for r in rows]
        absolute[kind] = {"tolerance": tol, "priced": len(rows), "within": sum(1 for r in rows if r.within),
                          "max_abs_diff": max(diffs) if diffs else None}
    n_priced = len(priced) + sum(a["priced"] for a in absolute.values())
    return {"points": len(found), "priced": n_priced, "skipped": len(found) - n_priced,
            "within_25pct": sum(1 for r in priced if r.within) / max(len(priced), 1),
            "median_abs_log_ratio": statistics.median(logs) if logs else None,
            "worst": [{"id": r.id, "ratio": r.ratio} for r in worst],
            "absolute": absolute}


def render(found: list[Row]) -> str:
    lines = [f"{'point':<44} {'kind':<10} {'published':>12} {'predicted':>12} {'ratio':>7} {'within':>6}  source"]
    for r in found:
        pred = f"{r.predicted:12.4g}" if r.predicted is not None else f"{'-':>12}"
        ratio = f"{r.ratio:7.2f}" if r.ratio is not None else f"{'-':>7}"
        within = {None: "-", True: "yes", False: "no"}[r.within]
        tail = r.source if not r.skipped else f"(skipped: {r.skipped}) {r.source}"
        unit = f"{r.unit} ({r.tolerance})" if r.absolute else r.unit
        lines.append(f"{r.id:<44} {r.kind:<10} {r.published:12.4g} {pred} {ratio} {within:>6}  {unit}; {tail}")
    s = summary(found)
    median = s["median_abs_log_ratio"]
    lines.append(f"\n{s['priced']} of {s['points']} points priced; within 25%: {s['within_25pct']:.0%}; median |log "
                 f"ratio| {median:.3f}" if median is not None else "\nno point priced")
    for kind, a in s["absolute"].items():
        if a["priced"]:
            lines.append(f"{kind}: within +-{a['tolerance']:g} (absolute): {a['within']} of {a['priced']}; "
                         f"largest |predicted - published| {a['max_abs_diff']:.2f}")
    lines.append("worst: " + ", ".join(f"{w['id']} x{w['ratio']:.2f}" for w in s["worst"]))
    return "\n".join(lines)
