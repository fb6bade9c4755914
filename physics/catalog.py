"""Model and GPU catalogues (data files with sources: physics/data/*.yaml)."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace
from importlib import resources

import yaml

from topology.gpus import part_name

WEIGHT_DTYPES: dict[str, tuple[float, str]] = {
    "bf16": (2.0, "bf16"),
    "fp16": (2.0, "bf16"),
    "fp8": (1.0, "fp8"),
    "fp4": (0.5625, "fp4"),
    "nvfp4": (0.5625, "fp4"),
    "mxfp4": (0.53125, "fp4"),
    "int8": (1.0, "bf16"),
    "int4": (0.53125, "bf16"),
}
"""Weight formats: bytes per parameter as stored (scales included) and the tensor rate the GEMMs
run at. FP8: one byte (block scales are < 0.1 %). NVFP4: 4-bit values and an FP8 scale per 16
(4.5 bits); MXFP4: an E8M0 scale per 32 (4.25 bits); both run at the FP4 rate on parts that have
one (Blackwell) and weight-only elsewhere (dequantised into BF16 GEMMs, as vLLM's Marlin kernels
do on Hopper and Ampere). INT4 (AWQ/GPTQ, group 128: 4 bits and an FP16 scale per 128, 4.125
bits, with zero points ~4.25) and INT8: weight-only, BF16 GEMMs."""
HBM_SHARE_DEFAULT = 0.79
"""A part with no measured share: the median of the NVIDIA parts FluidX3D measured (A100 77, H100
SXM 80, H100 NVL 79, GH200 79, H200 73, B200 81, B300 81 %; physics/data/published/gpu-achieved.yaml
FLUIDX3D)."""
MATMUL_SHARE_REFERENCE = 0.80
"""The share of its data sheet's BF16 rate the median NVIDIA part's best-shaped matmul reaches:
A100 0.87, A800 0.85, B200 0.78, B300 0.79, GB200 0.73, GH200 0.85, H100 NVL 0.59, H100 SXM 0.81,
H20 0.96, H200 0.80, L40S 0.74 (median 0.799; stas00/ml-engineering's maximum achievable matmul
FLOPS table, torch matmul benchmarks, Azure's GEMM runs: physics/data/published/gpu-achieved.yaml).
The points the shares of peak are fitted to are on such parts."""
FP8_MATMUL_SHARE_REFERENCE = 0.745
"""The same for FP8 (its data sheet's dense FP8 rate): B200 0.76, B300 0.75, GB200 0.72, GH200
0.78, H100 SXM 0.71, H200 0.73, H800 0.78 (median 0.745; same file)."""
KV_DTYPES: dict[str, float] = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0}
"""KV-cache formats: bytes per cached element (vLLM `--kv-cache-dtype fp8`: one byte, per-tensor
scales)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    name: str
    bf16_tflops: float
    hbm_gb_s: float
    memory_gb: float
    source: str
    fp8_tflops: float | None = None
    """Dense FP8 tensor throughput; None: no FP8 tensor cores (FP8 weights compute at the BF16 rate)."""
    hbm_share: float | None = None
    """Share of `hbm_gb_s` a memory-bound kernel reaches on this part (measured; None: unknown,
    `HBM_SHARE_DEFAULT`)."""
    hbm_share_source: str = ""
    serving_share: float = 1.0
    """What serving engines' memory-bound steps reach on this part relative to `memory_gb_s`
    (1 unless published serving measurements on the part say otherwise; the leave-one-source-out
    fit frees it per part, from the other sources' points on it). It also scales the rate a
    weight-only format's dequantisation runs at (`costmodel.dequant_s`), empirically."""
    fp4_tflops: float | None = None
    """Dense FP4 tensor throughput (Blackwell); None: FP4 weights are weight-only (BF16 GEMMs)."""
    fp4_source: str = ""
    matmul_share: float | None = None
    """Share of `bf16_tflops` the part's best-shaped BF16 matmul reaches (measured; None: unknown,
    `MATMUL_SHARE_REFERENCE`). Parts differ: NVIDIA's 0.73-0.96, MI300X 0.58, H100 NVL (a 400 W
    part) 0.59 (physics/data/published/gpu-achieved.yaml)."""
    fp8_matmul_share: float | None = None
    """The same for `fp8_tflops` (and FP4's rate); None: the BF16 share's standing against its own
    reference (`compute_factor`)."""
    matmul_source: str = ""
    sfu_tops: float | None = None
    """Special-function results per second (tera) the part's SMs return, the exponentials of a
    softmax among them: 16 per SM per clock on Ampere and Hopper (CUDA C++ Programming Guide,
    arithmetic-instruction throughput) at the clock its tensor peak is quoted at (gpus.yaml).
    None: not known (attention's exponentials not priced)."""
    sfu_source: str = ""
    fp32_tflops: float | None = None
    """The data sheet's FP32 rate on the SMs' CUDA cores (AMD: FP32 vector), dense, without the
    tensor cores: the rate a weight-only format's dequantisation (unpack, convert, scale: ALU work
    on every weight) runs at (`costmodel.dequant_s`). None: not known (a weight-only format on
    this part cannot be priced)."""
    fp32_source: str = ""
    tensor_cap: float = 1.0
    """The data sheet's BF16 tensor rate over the rate its SMs could issue at its FP32 rate (16
    tensor FLOPs per FP32 FLOP on Ampere and Hopper: A100 312 of 19.5 x 16, H100 SXM 989 of 67 x
    16 at a lower clock). 1: not capped. A capped part (H20: 148 TFLOPS BF16 beside 44 TFLOPS
    FP32, 0.21) runs its tensor cores slower than the rest of each SM, so the non-matmul work a
    kernel cannot overlap (softmax, exponentials, loads) hides under its matmuls in proportion
    (`flops.attention_s`)."""
    tensor_cap_source: str = ""
    nvls: bool = False
    """Its NVSwitch does NVLink SHARP (NCCL's NVLS all-reduce)."""
    nvls_efficiency: float = 0.85
    """NCCL's `nvlsEfficiency` for its generation (tuning.cc: Hopper 0.85, Blackwell 0.74;
    `collectives.NVLS_HOPPER`)."""
    collectives: str = "nccl"
    """The collective library its engines use: nccl (NVIDIA) or rccl (AMD)."""

    def __post_init__(self) -> None:
        if self.collectives not in ("nccl", "rccl"):
            raise ValueError(f"{self.name}: collectives is nccl or rccl, not {self.collectives!r}")
    fp8_source: str = ""

    @property
    def kernel_gb_s(self) -> float:
        """What one memory-bound kernel reaches here on its own: the data sheet's bandwidth times the
        share measured on this part (no serving share: `memory_gb_s` is a serving step's)."""
        return self.hbm_gb_s * (self.hbm_share if self.hbm_share is not None else HBM_SHARE_DEFAULT)

    @property
    def memory_gb_s(self) -> float:
        """What a serving engine's memory-bound step reads at here: `kernel_gb_s` (the data sheet's
        bandwidth times the share measured on this part: parts reach from 58 to 81 % of their data
        sheet) times the part's `serving_share`."""
        return self.kernel_gb_s * self.serving_share

    def tflops(self, compute: str) -> float:
        """The tensor rate GEMMs of `compute` (a `WEIGHT_DTYPES` rate: bf16, fp8, fp4) run at here,
        as the fitted shares of peak see it: the data sheet's times `compute_factor`; a rate the part
        lacks falls back to BF16 (weight-only quantisation)."""
        narrow = self._narrow_tflops(compute)
        if narrow:
            return narrow * self.compute_factor("fp8")
        return self.bf16_tflops * self.compute_factor("bf16")

    def _narrow_tflops(self, compute: str) -> float | None:
        """The data sheet's rate for a narrower-than-BF16 `compute` (fp8, fp4); None: BF16's."""
        return self.fp4_tflops if compute == "fp4" else self.fp8_tflops if compute == "fp8" else None

    def compute_factor(self, compute: str) -> float:
        """How much more of its data sheet this part's GEMMs reach than the reference parts' do
        (`MATMUL_SHARE_REFERENCE`): the GEMMs' shares of peak the cost model fits (prefill, FP8,
        decode) are the reference parts', so a part's GEMMs are priced at them times this. BF16's
        for bf16; FP8's (and FP4's) for the low-precision rates, or BF16's standing where FP8 was
        not measured. Attention kernels keep the data sheet's rate and their own share of it:
        how much of a part FlashAttention reaches is the kernel's and the architecture's ("50-73 %
        of the theoretical maximum" on A100 for FlashAttention-2, arXiv 2307.08691; 75 % on H100
        for FlashAttention-3, arXiv 2407.08608), not the part's GEMM share."""
        bf16 = (self.matmul_share or MATMUL_SHARE_REFERENCE) / MATMUL_SHARE_REFERENCE
        if compute == "bf16":
            return bf16
        return self.fp8_matmul_share / FP8_MATMUL_SHARE_REFERENCE if self.fp8_matmul_share else bf16

    def rate_used(self, spec: ModelSpec) -> str:
        """Which tensor rate `spec`'s GEMMs run at here, and why (what `cost` echoes)."""
        wanted = spec.compute
        if wanted == "bf16" and spec.weight_format not in ("bf16", "fp16"):
            return "bf16 rate (weight-only: dequantised into BF16 GEMMs)"
        if wanted != "bf16" and not self.low_precision(wanted):
            return f"bf16 rate (weight-only: no {wanted.upper()} tensor cores)"
        return f"{wanted} rate"

    def low_precision(self, compute: str) -> bool:
        """GEMMs of `compute` run at a narrower tensor rate than BF16 here."""
        return bool(self._narrow_tflops(compute))


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
    routing_skew: float = 0.0
    """How unevenly tokens pick experts (a Zipf exponent over the experts: 0 uniform): a skewed
    batch touches fewer distinct experts (`costmodel.expected_experts`)."""

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
    weight_bytes: float
    kv_bytes: float
    kv_per_token_layer: int
    max_context: int
    source: str
    attention: str = "gqa"
    """gqa (grouped-query, MHA when kv_heads == heads) or mla (DeepSeek's latent attention: one
    compressed KV shared by all heads, so tensor parallelism does not shard it)."""
    moe: MoESpec | None = None
    weight_dtype: str = ""
    """A `WEIGHT_DTYPES` name; empty: bf16 for 2 bytes, fp8 for 1."""
    qk_head_dim: int = 0
    """Per-head dimension of a query and key at prefill (0: `head_dim`). MLA attends at prefill
    in its decompressed form: qk_nope_head_dim + qk_rope_head_dim (DeepSeek-V3: 128 + 64)."""
    v_head_dim: int = 0
    """Per-head dimension of a value at prefill (0: `head_dim`; DeepSeek-V3's v_head_dim 128)."""
    vocab: int = 0
    """Vocabulary size (config.json vocab_size): the LM head (vocab x hidden) a step multiplies
    only at the positions it samples, and the input embedding a gather; 0: unknown (both priced
    as body weights)."""
    tied_embeddings: bool = False
    """config.json tie_word_embeddings: the input embedding and the LM head are one matrix,
    counted once in `params_b` and `active_params_b` (OPT); else two (Llama, Qwen, DeepSeek)."""

    @property
    def weight_format(self) -> str:
        """The weight format's name (`WEIGHT_DTYPES`)."""
        return self.weight_dtype or ("fp8" if self.weight_bytes == 1 else "bf16")

    @property
    def compute(self) -> str:
        """The tensor rate its GEMMs run at (`WEIGHT_DTYPES`)."""
        if self.weight_dtype:
            return WEIGHT_DTYPES[self.weight_dtype][1]
        return "fp8" if self.weight_bytes == 1 else "bf16"

    def with_dtypes(self, weights: str | None = None, kv: str | None = None) -> ModelSpec:
        """The model stored in other formats (`WEIGHT_DTYPES`, `KV_DTYPES`); None keeps one."""
        spec = self
        if weights is not None:
            if weights not in WEIGHT_DTYPES:
                raise ValueError(f"unknown weight dtype {weights!r} (known: {', '.join(WEIGHT_DTYPES)})")
            size = WEIGHT_DTYPES[weights][0]
            moe = spec.moe
            if moe is not None and moe.expert_weight_bytes and moe.expert_weight_bytes > size:
                moe = replace(moe, expert_weight_bytes=size)
            spec = replace(spec, weight_bytes=size, weight_dtype=weights, moe=moe)
        if kv is not None:
            if kv not in KV_DTYPES:
                raise ValueError(f"unknown KV-cache dtype {kv!r} (known: {', '.join(KV_DTYPES)})")
            spec = replace(spec, kv_bytes=KV_DTYPES[kv])
        return spec

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

    @property
    def head_params_b(self) -> float:
        """The LM head's parameters (billions): vocab x hidden."""
        return self.vocab * self.hidden / 1e9

    @property
    def embedding_params_b(self) -> float:
        """The input embedding's own matrix (billions; 0 when tied to the LM head)."""
        return 0.0 if self.tied_embeddings else self.head_params_b

    @property
    def body_params_b(self) -> float:
        """Active parameters every token multiplies: all but the input embedding and the LM head
        (`physics.flops`)."""
        return max(self.active_params_b - self.embedding_params_b - self.head_params_b, 0.0)

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


@functools.cache
def _memory_gb() -> dict[str, float]:
    return {n: g.memory_gb for n, g in gpus().items()}


def gpu_name(text: str) -> str:
    """The catalogue's name for a part as people and tools write it ("H100", "NVIDIA H100 80GB
    HBM3", "A100-SXM4-80GB": `topology.gpus.part_name`, which refuses rather than guesses)."""
    return part_name(text, _memory_gb())


_MODEL_NOISE = re.compile(r"^(instruct|chat|hf|base|it|thinking|v\d+\.\d+|\d{4})$")
_SAME_MODEL = {"deepseek-r1": "deepseek-v3"}
"""Checkpoints the catalogue lists under another name: DeepSeek-R1 is DeepSeek-V3's architecture
(the same config.json but for its weights)."""


def model_name(text: str) -> str:
    """The catalogue's name for a model as people and tools write it: any case, the Hugging Face
    organisation dropped ("meta-llama/Llama-3.1-70B-Instruct" is llama-3.1-70b, "Qwen/Qwen3-8B"
    qwen3-8b), and the words that name a tuning or a release rather than an architecture (instruct,
    chat, hf, base, it, thinking, a version such as v0.1, a four-digit date such as 2507 or 0528);
    DeepSeek-R1 is deepseek-v3. A weight format in the name stays (llama-3.1-70b-fp8 is its own
    entry); anything else the catalogue does not list is refused."""
    known = models()
    if text in known:
        return text
    words = [w for w in re.split(r"[\s_-]+", text.strip().lower().rsplit("/", 1)[-1]) if w]
    if words[:2] == ["meta", "llama"]:
        words = words[1:]
    name = "-".join(w for w in words if not _MODEL_NOISE.match(w))
    name = _SAME_MODEL.get(name, name)
    if name not in known:
        raise ValueError(f"unknown model {text!r} (known: {', '.join(sorted(known))})")
    return name


def gpu(name: str) -> GpuSpec:
    """A part by its catalogue name or a name `gpu_name` reads as one."""
    return gpus()[gpu_name(name)]


def model(name: str) -> ModelSpec:
    """A model by its catalogue name or a name `model_name` reads as one."""
    return models()[model_name(name)]
