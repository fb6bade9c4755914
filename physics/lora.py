"""What a LoRA adapter costs an engine: its bytes, loading it, making it active, and serving a batch
with adapters in it. Pure arithmetic on the model's shape; each number says where it comes from.

- Size: vLLM allocates every adapter slot at `--max-lora-rank` (its LoRA layers' stacked A/B
  buffers, vllm/lora/layers), so an adapter of rank r on the attention projections of a model
  with hidden size h, q width q = heads x head_dim and KV width k = kv_heads x head_dim holds
  r x (in + out) per projection: q (h + q), k (h + k), v (h + k), o (q + h), per layer, in the
  adapter's dtype (16-bit: vLLM's lora_dtype "auto" follows the base model's activations).
  Assumption: the four attention projections, PEFT's usual target set for serving adapters; an
  adapter that also targets the MLP is 2-3x larger. Llama-3 8B at rank 16: 27 MB.
- Loading (`/v1/load_lora_adapter`, or the first request of an adapter the CPU cache dropped):
  read the safetensors from local disk into host memory, plus a fixed cost for opening and
  checking the checkpoint and building its tensors (`LOAD_FIXED_MS`, an assumption).
- Activation (the adapter joins a GPU slot, `--max-loras` of them): a host-to-device copy over
  PCIe.
- A step with adapters in its batch: Punica's SGMV kernels (what vLLM's LoRA layers run,
  vllm/lora/punica_wrapper) add about 2 ms per token on a 7B model (Chen et al., "Punica:
  Multi-Tenant LoRA Serving", MLSys 2024, arXiv:2310.18547, abstract and section 7: Llama-2 7B,
  32 layers, A100), taken here as 2 ms / 32 per layer of the model, plus reading every distinct
  adapter's weights once from HBM. S-LoRA (Sheng et al., arXiv:2311.03285) reports the same
  order ("a small overhead") for its heterogeneous-batch kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

from physics.catalog import GpuSpec, ModelSpec
from topology.kinds import PCIE_X16_GB_S

ADAPTER_DTYPE_BYTES = 2.0
"""16-bit adapter weights (bf16/fp16, vLLM's lora_dtype "auto" on a 16-bit model)."""
DEFAULT_MAX_LORA_RANK = 16
"""vLLM's `--max-lora-rank` default (vllm/config/lora.py `LoRAConfig.max_lora_rank`)."""
DEFAULT_MAX_LORAS = 1
"""vLLM's `--max-loras` default: adapters in one batch (`LoRAConfig.max_loras`)."""
DISK_READ_GB_S = 3.5
"""Reading the checkpoint from local NVMe: a PCIe Gen3 x4 data-centre SSD's sequential read
(3,500 MB/s, e.g. Samsung PM983/970-class data sheets); an assumption: a warm page cache is faster,
a network file system slower."""
LOAD_FIXED_MS = 20.0
"""Opening, parsing and checking the adapter's config and safetensors and building its tensors
(vLLM's LoRAModel.from_local_checkpoint): an assumption, of the order of the tens of
milliseconds users report for small adapters."""
HOST_TO_DEVICE_SHARE = 0.8
"""A pinned host-to-device copy reaches ~80 % of the PCIe x16 line rate (Gen4: ~25 of 31.5 GB/s,
NVIDIA's bandwidthTest on A100/H100 hosts)."""
PUNICA_MS_PER_TOKEN = 2.0
PUNICA_REFERENCE_LAYERS = 32
"""Punica's added latency per token (2 ms) and the layers of the model it was measured on
(Llama-2 7B): `step_overhead_ms` scales it by the model's layers."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LoraCost:
    """What adapters cost one engine of `model` on `gpu` at TP `tp`."""

    model: ModelSpec
    gpu: GpuSpec
    tp: int = 1
    max_lora_rank: int = DEFAULT_MAX_LORA_RANK
    pcie_generation: int = 4

    def adapter_bytes(self) -> float:
        """One adapter at `max_lora_rank` on the attention projections (module docstring)."""
        m = self.model
        q, kv = m.heads * m.head_dim, m.kv_heads * m.head_dim
        per_layer = (m.hidden + q) + 2 * (m.hidden + kv) + (q + m.hidden)
        return self.max_lora_rank * per_layer * m.layers * ADAPTER_DTYPE_BYTES

    def load_ms(self) -> float:
        """Disk to host memory (the adapter's CPU-cache copy)."""
        return LOAD_FIXED_MS + self.adapter_bytes() / (DISK_READ_GB_S * 1e9) * 1e3

    def activate_ms(self) -> float:
        """Host memory to a GPU slot (each TP rank copies its shard at once, over its own link)."""
        rate = PCIE_X16_GB_S.get(self.pcie_generation, PCIE_X16_GB_S[4]) * HOST_TO_DEVICE_SHARE
        return self.adapter_bytes() / self.tp / (rate * 1e9) * 1e3

    def step_overhead_ms(self, adapters: int) -> float:
        """A step whose batch holds `adapters` distinct adapters (0: none, no overhead)."""
        if adapters <= 0:
            return 0.0
        kernels = PUNICA_MS_PER_TOKEN * self.model.layers / PUNICA_REFERENCE_LAYERS
        reads = adapters * self.adapter_bytes() / self.tp / (self.gpu.memory_gb_s * 1e9) * 1e3
        return kernels + reads
