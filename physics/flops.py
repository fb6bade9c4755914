"""What a forward pass multiplies: the FLOPs of the weights' GEMMs and of attention, counted as
the engines run them (`physics.costmodel` and `physics.moecost` price them).

    weights     2 FLOPs per body parameter for every token of a step, where the body is every
                active parameter but the input embedding and the LM head (`ModelSpec.body_params_b`):
                the embedding is a gather (a row per token, no matmul), and the LM head multiplies
                only the positions the engine samples, one per scheduled sequence: vLLM computes
                logits at `logits_indices = query_start_loc[1:] - 1`, each request's last scheduled
                token, a partial prefill chunk's included ("we do so for simplicity"; vllm-project/
                vllm vllm/v1/worker/gpu_model_runner.py `_prepare_inputs`, commit
                4e1790651fc758c06c7a903dd4cd82364ac91b27), so a prefill chunk adds 2 vocab x hidden
                FLOPs once, a decode token once (`head_flops`).
    attention   per (query, key) pair and layer, every query head's QK and PV products, 2 heads
                (d_qk + d_v) FLOPs (`attention_flops`), at `attention_mfu` of peak BF16, then one
                softmax exponential per head at the part's special-function rate (`attention_s`;
                on a tensor-capped part, H20, that other work hides under the matmuls in
                proportion to the cap).
                A causal prefill chunk of n tokens after c cached ones attends over n^2/2 + n c
                pairs.
"""

from __future__ import annotations

from physics.catalog import GpuSpec, ModelSpec

MLA_ROPE_DIM = 64
"""DeepSeek-V3's qk_rope_head_dim (config.json): at decode MLA attends in its absorbed form over
the cached latent (`head_dim` 576 = kv_lora_rank 512 + this) and returns the 512-wide latent."""


def body_flops(model: ModelSpec, tokens: float) -> float:
    """The weights' FLOPs of `tokens` tokens, the LM head apart (`head_flops`)."""
    return 2 * model.body_params_b * 1e9 * tokens


def head_flops(model: ModelSpec, sampled: float) -> float:
    """The LM head's FLOPs for `sampled` positions (one per sequence a step schedules)."""
    return 2 * model.head_params_b * 1e9 * sampled


def step_flops(model: ModelSpec, tokens: float, sampled: float) -> float:
    """The weights' FLOPs of a step of `tokens` tokens over `sampled` sequences."""
    return body_flops(model, tokens) + head_flops(model, min(sampled, tokens))


def attention_flops(model: ModelSpec, pairs: float, decode: bool) -> float:
    """FLOPs of attention over `pairs` (query, cached key) pairs in every layer: every query head
    multiplies its query with the key (d_qk) and its weights with the value (d_v), 2 FLOPs per
    multiply-add. GQA: both `head_dim` (Qwen3-235B: 64 heads x 128, twice its hidden 4096). MLA at
    prefill: `qk_head_dim` and `v_head_dim` (DeepSeek-V3: 192 and 128 over 128 heads, 2.9 times
    4 x hidden); at decode (absorbed): the latent and rope (576) for QK, the latent (512) for PV."""
    if model.attention == "mla" and decode:
        per = 2 * model.heads * (2 * model.head_dim - MLA_ROPE_DIM)
    else:
        per = 2 * model.heads * ((model.qk_head_dim or model.head_dim) + (model.v_head_dim or model.head_dim))
    return float(per) * pairs * model.layers


def attention_s(model: ModelSpec, gpu: GpuSpec, pairs: float, mfu: float) -> float:
    """Seconds one GPU's worth of a prefill's attention over `pairs` causal pairs takes (divide by
    TP: heads split over ranks): the QK and PV matmuls at `mfu` of peak BF16, then each head's
    softmax exponential at the special-function rate (`GpuSpec.sfu_tops`), one after the other.
    FlashAttention-3 names the exponentials the bound on H100 (989 TFLOPS of matmul, 3.9 of
    special functions; arXiv 2407.08608 section 3.1) and its measured forward rates follow the sum
    across head dims: 497 and 648 TFLOPS at head dim 64 and 128 (its FP16 forward benchmark at 16K
    tokens) and up to 740 at 256 (abstract), where the sum gives 484, 639, 761 at `mfu` 0.95 (the
    max of the two would give 940 at every head dim). A part with no known rate prices the
    matmuls alone. On a part whose tensor rate is capped below what its SMs issue
    (`GpuSpec.tensor_cap`, H20 0.21) that other work (the kernel's shortfall from peak and the
    exponentials) takes the same time beside matmuls that take longer, and hides under them in
    that proportion: SGLang's million-token prompts on H20 (SGL-CPP-BLOG) put its attention near
    its data sheet, where the uncapped sum would read them 1.2-1.3x slow."""
    ideal = attention_flops(model, pairs, False) / (gpu.bf16_tflops * 1e12)
    exps = model.heads * pairs * model.layers / (gpu.sfu_tops * 1e12) if gpu.sfu_tops else 0.0
    return ideal + gpu.tensor_cap * (ideal * (1 / mfu - 1) + exps)
