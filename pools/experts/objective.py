"""The step an expert map gives a gang, as the cost model predicts it: what the `topology` policy
minimises (`pools.experts.policies.topology`, `step=`) and what `python -m pools experts` prints.

One MoE step of the gang at a reference shape (a decode step: `REFERENCE_BATCH` sequences per
rank reading `REFERENCE_CONTEXT` tokens each; a prefill step: `REFERENCE_PREFILL_TOKENS` new
tokens per rank), with the map's imbalance (max over mean GPU expert load: the busiest rank
sets the pace) and its share of (token, expert) pairs that leave their NVLink domain (what the
all-to-all carries over the network), `physics.moecost.moe_step`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Literal

from physics.alltoall import Carrier, GangLinks
from physics.catalog import GpuSpec, ModelSpec
from physics.moecost import MoEStep, moe_step
from pools.experts.metrics import Gang, LayerStats

Phase = Literal["decode", "prefill"]
REFERENCE_BATCH, REFERENCE_CONTEXT = 64, 1024
"""The decode step priced: sequences per rank and their context."""
REFERENCE_PREFILL_TOKENS = 4096
"""The prefill step priced: new tokens per rank (DeepSeek's prefill: 4096-token chunks)."""


def step(model: ModelSpec, gpu: GpuSpec, links: GangLinks, size: int, balancedness: float, cross_share: float,
         phase: Phase = "decode") -> MoEStep:
    """The gang's MoE step, by part, with this balancedness and cross-domain share in every layer."""
    used = replace(links, outside_share=cross_share) if links.carrier != "nvlink" else links
    imbalance = 1.0 / max(balancedness, 1e-6)
    if phase == "prefill":
        return moe_step(model, gpu, 1, size, used, prefill_tokens=REFERENCE_PREFILL_TOKENS, imbalance=imbalance)
    return moe_step(model, gpu, 1, size, used, decodes=REFERENCE_BATCH, decode_context=REFERENCE_CONTEXT,
                    imbalance=imbalance)


def step_ms(model: ModelSpec, gpu: GpuSpec, links: GangLinks, size: int, stats: LayerStats,
            phase: Phase = "decode") -> float:
    """The gang's MoE step (ms) with this layer's map applied to every layer."""
    return step(model, gpu, links, size, stats.balancedness, stats.cross_share, phase).total_ms


def objective(model: ModelSpec, gpu: GpuSpec, links: GangLinks, size: int, phase: Phase = "decode"
              ) -> Callable[[LayerStats], float]:
    """`step_ms` for one gang, as a function of a map's figures."""
    return lambda stats: step_ms(model, gpu, links, size, stats, phase)


def plain_links(gang: Gang, carrier: Carrier, nvlink_gb_s: float, nic_gb_s: float = 50.0,
                nic_latency_us: float = 3.0) -> GangLinks:
    """The gang's links without a topology: NVLink inside one domain, else `carrier` between its
    domains, each rank's domain holding the gang's smallest domain count of GPUs."""
    domains = set(gang.domain)
    if len(domains) == 1:
        return GangLinks(carrier="nvlink", domain_ranks=gang.size, nvlink_gb_s=nvlink_gb_s)
    per = min(gang.domain.count(d) for d in domains)
    return GangLinks(carrier=carrier, domain_ranks=per, nvlink_gb_s=nvlink_gb_s, nic_gb_s=nic_gb_s,
                     nic_latency_us=nic_latency_us)
