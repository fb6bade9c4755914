"""Model and GPU catalogues (data files with sources: pools/data/*.yaml)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources

import yaml


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    name: str
    bf16_tflops: float
    hbm_gb_s: float
    memory_gb: float
    source: str
    fp8_tflops: float | None = None
    """Dense FP8 tensor throughput; None: no FP8 tensor cores (FP8 weights compute at the BF16 rate)."""
    nvls: bool = False
    """Its NVSwitch does NVLink SHARP (NCCL's NVLS all-reduce)."""
    fp8_source: str = ""

    def tflops(self, weight_bytes: int) -> float:
        """The tensor rate a model stored in `weight_bytes` per parameter computes at."""
        return self.fp8_tflops if weight_bytes == 1 and self.fp8_tflops else self.bf16_tflops


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    name: str
    params_b: float
    active_params_b: float
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    weight_bytes: int
    kv_bytes: int
    kv_per_token_layer: int
    max_context: int
    source: str

    @property
    def weights_gb(self) -> float:
        return self.params_b * self.weight_bytes

    def kv_bytes_per_token(self) -> float:
        return float(self.layers * self.kv_per_token_layer * self.kv_bytes)


def _load(name: str) -> dict[str, dict[str, object]]:
    data = yaml.safe_load(resources.files("pools").joinpath(f"data/{name}").read_text())
    assert isinstance(data, dict)
    return data


@functools.cache
def gpus() -> dict[str, GpuSpec]:
    return {k: GpuSpec(name=k, **v) for k, v in _load("gpus.yaml").items()}  # type: ignore[arg-type]


@functools.cache
def models() -> dict[str, ModelSpec]:
    return {k: ModelSpec(name=k, **v) for k, v in _load("models.yaml").items()}  # type: ignore[arg-type]


def gpu(name: str) -> GpuSpec:
    try:
        return gpus()[name]
    except KeyError:
        raise ValueError(f"unknown GPU {name!r} (known: {', '.join(sorted(gpus()))})") from None


def model(name: str) -> ModelSpec:
    try:
        return models()[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r} (known: {', '.join(sorted(models()))})") from None
