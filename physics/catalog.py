"""Model and GPU catalogues (data files with sources: physics/data/*.yaml)."""

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
class MoESpec:
    """A mixture-of-experts model's expert layers (config.json: n_routed_experts / num_experts,
    num_experts_per_tok, moe_intermediate_size, first_k_dense_replace, n_group / topk_group)."""

    routed_experts: int
    experts_per_token: int
    expert_ffn: int
    """Intermediate size of one expert (gate, up and down projections: 3 x hidden x this)."""
    moe_layers: int
    shared_experts: int = 0
    """Experts every token goes through (DeepSeek's shared expert), each of `expert_ffn`."""
    dense_ffn: int = 0
    """Intermediate size of the dense layers' FFN (the layers that are not MoE); 0: none."""
    groups: int = 1
    """Expert groups for group-limited routing (DeepSeek-V3: 8 groups, a token's experts in 4)."""
    groups_per_token: int = 1
    expert_weight_bytes: float = 0.0
    """Bytes per expert parameter when the experts are stored narrower than the rest (gpt-oss:
    MXFP4, 4.25 bits); 0: the model's weight_bytes."""

    def expert_params(self, hidden: int) -> float:
        """Parameters of one expert in one layer."""
        return 3.0 * hidden * self.expert_ffn


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
    attention: str = "gqa"
    """gqa (grouped-query, MHA when kv_heads == heads) or mla (DeepSeek's latent attention: one
    compressed KV shared by all heads, so tensor parallelism does not shard it)."""
    moe: MoESpec | None = None

    @property
    def weights_gb(self) -> float:
        """All weights (GB): the routed experts at their own width, the rest at weight_bytes."""
        if self.moe is None:
            return self.params_b * self.weight_bytes
        return self.dense_params_b * self.weight_bytes + self.routed_params_b * self.expert_bytes

    @property
    def expert_bytes(self) -> float:
        if self.moe is None:
            return float(self.weight_bytes)
        return self.moe.expert_weight_bytes or float(self.weight_bytes)

    @property
    def routed_params_b(self) -> float:
        """Parameters (billions) of all routed experts of all layers (0 for a dense model)."""
        if self.moe is None:
            return 0.0
        return self.moe.moe_layers * self.moe.routed_experts * self.moe.expert_params(self.hidden) / 1e9

    @property
    def dense_params_b(self) -> float:
        """Everything but the routed experts: attention, embeddings, dense FFNs, shared experts
        (every data-parallel rank holds these; expert parallelism splits only the routed ones)."""
        return max(self.params_b - self.routed_params_b, 0.0)

    @property
    def routed_active_params_b(self) -> float:
        """Routed-expert parameters one token goes through (experts_per_token per MoE layer)."""
        if self.moe is None:
            return 0.0
        return self.moe.moe_layers * self.moe.experts_per_token * self.moe.expert_params(self.hidden) / 1e9

    @property
    def dense_active_params_b(self) -> float:
        return max(self.active_params_b - self.routed_active_params_b, 0.0)

    def kv_bytes_per_token(self) -> float:
        return float(self.layers * self.kv_per_token_layer * self.kv_bytes)


def _load(name: str) -> dict[str, dict[str, object]]:
    data = yaml.safe_load(resources.files("physics").joinpath(f"data/{name}").read_text())
    assert isinstance(data, dict)
    return data


@functools.cache
def gpus() -> dict[str, GpuSpec]:
    return {k: GpuSpec(name=k, **v) for k, v in _load("gpus.yaml").items()}  # type: ignore[arg-type]


@functools.cache
def models() -> dict[str, ModelSpec]:
    out = {}
    for k, v in _load("models.yaml").items():
        fields = dict(v)
        moe = fields.pop("moe", None)
        spec = MoESpec(**moe) if isinstance(moe, dict) else None
        out[k] = ModelSpec(name=k, moe=spec, **fields)  # type: ignore[arg-type]
    return out


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
