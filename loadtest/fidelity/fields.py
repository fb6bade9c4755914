"""Reading a published point's fields (`physics/data/calibration.yaml`, `physics/data/published/
*.yaml`) as the fidelity conversion (`loadtest.fidelity.predict`) and fit take them: numbers that
may be written as words, the names sources use for catalogue parts and models, formats, links and
speculative-decoding settings."""

from __future__ import annotations

from typing import Any

from physics import catalog

DTYPES = {"fp16": "bf16", "bf16": "bf16", "fp8": "fp8", "int8": "fp8w", "int4": "int4", "nvfp4": "nvfp4",
          "fp4": "fp4", "mxfp4": "mxfp4"}
"""Weight formats as the points write them (FP16 and BF16 run at the same rate everywhere; int8
weight-only is one byte at the BF16 rate)."""
def num(p: dict[str, Any], key: str) -> float | None:
    """A numeric condition, or None when absent or written as words ("not stated ...")."""
    value = p.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def int_of(p: dict[str, Any], key: str, default: int) -> int:
    value = num(p, key)
    return int(value) if value is not None else default


def names(p: dict[str, Any]) -> tuple[str | None, str | None, str]:
    """The point's model and GPU as the catalogue names them (`physics.catalog.model_name` and
    `gpu_name` read the names sources use: Mooncake's "H800", LMDeploy's "A100-80G",
    "Llama-3.3-70B-Instruct"), or why not."""
    model, gpu = p.get("model"), p.get("gpu")
    try:
        model = catalog.model_name(model) if isinstance(model, str) else None
    except ValueError:
        return None, None, f"model {model} is not in the catalogue"
    try:
        gpu = catalog.gpu_name(gpu) if isinstance(gpu, str) else None
    except ValueError:
        return None, None, f"GPU {gpu} is not in the catalogue"
    return model, gpu, ""


def dtypes_of(p: dict[str, Any]) -> tuple[str | None, str | None]:
    """(weights, KV cache) formats the point states; None: as catalogued."""
    raw = str(p.get("dtype") or "").split(" ")[0].lower()
    weights = DTYPES.get(raw)
    if weights == "fp8w":
        weights = "int8"
    kv = str(p.get("kv_dtype") or "").split(" ")[0].lower()
    return weights, ("fp8" if kv == "fp8" else None)


def link_of(p: dict[str, Any], default: str = "rdma") -> str:
    text = str(p.get("link") or default).lower()
    for name in ("nvswitch", "nvlink", "xgmi", "pcie", "tcp", "rdma", "efa"):
        if text.startswith(name):
            return name
    return default


def speculation(spec: Any) -> tuple[int, float | None]:
    """(draft tokens, acceptance length) a point states; a length stated as a range ("1.8-1.9")
    is its middle. A spec that states `steps` is SGLang's (EAGLE/NEXTN): `steps` draft passes, and
    its `draft_tokens` is the verify width, the drafts and the sequence's own token (with
    `--speculative-eagle-topk 1` SGLang sets `speculative_num_draft_tokens` to num_steps + 1;
    "speculative_num_draft_tokens: maximum parallel verification capacity", docs.sglang.io
    advanced_features/speculative_decoding, read 2026-12-04), so the drafts are the steps."""
    if not isinstance(spec, dict) or str(spec.get("method", "none")).lower() in ("none", "off"):
        return 0, None
    draft, length = spec.get("draft_tokens"), spec.get("acceptance_length")
    steps, topk = spec.get("steps"), spec.get("eagle_topk", 1)
    if isinstance(steps, int) and not isinstance(steps, bool) and topk == 1:
        draft = steps
    if isinstance(length, str):
        try:
            ends = [float(part) for part in length.split("-")]
        except ValueError:
            ends = []
        length = sum(ends) / len(ends) if 1 <= len(ends) <= 2 else None
    if not isinstance(draft, int) or not isinstance(length, int | float):
        raise ValueError("speculative decoding without its draft tokens and acceptance length stated")
    return int(draft), float(length)
