"""How many requests per second one replica of a pool serves within the SLO targets: the sizing
model (`pools.sizing`, from the cost model) for the pool's role, TP size and the best link the
topology offers a TP group of that size, for the requests' mean prompt and output lengths.

The sizing model prices the mean request; a tail target (p95) needs room above the mean, so the
capacity is taken at `slo_share` of the targets (0.8: a mean TPOT of 40 ms for a 50 ms
target). The policy divides the observed rate by it (`pools.autoscale.policy.desired`).

Gangs (pp > 1, dp > 1 or expert parallel) have no prediction: they follow the load and SLO
rules alone.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from physics import catalog, costmodel
from pools import sizing
from pools.model import PoolSpec, SLOClass
from topology import Topology

LENGTH_STEP = 64
"""Mean lengths are rounded to this many tokens, so the capacity is computed once per bucket."""


def replica_capacity(spec: PoolSpec, topology: Topology, classes: Sequence[SLOClass], prompt_tokens: float,
                     output_tokens: float, slo_share: float = 0.8) -> float | None:
    """Requests per second one replica of `spec` keeps within `slo_share` of the strictest
    targets of `classes` (None: a gang, a model outside the catalogue, or no TP size that meets
    them)."""
    if spec.model is None or spec.pp > 1 or spec.dp > 1 or spec.expert_parallel or not classes:
        return None
    gpu = next((g.model for n in topology.nodes for g in n.gpus if g.model), None)
    if gpu is None or spec.model not in catalog.models():
        return None
    link = sizing.best_link(topology, spec.tp)
    if link is None:
        return None
    ttft = min(c.ttft_ms for c in classes) * slo_share
    tpot = min(c.tpot_ms for c in classes) * slo_share
    return _capacity(spec.model, gpu, spec.tp, spec.role, link, _bucket(prompt_tokens), _bucket(output_tokens),
                     ttft, tpot)


def _bucket(tokens: float) -> int:
    return max(LENGTH_STEP, round(tokens / LENGTH_STEP) * LENGTH_STEP)


@functools.lru_cache(maxsize=1024)
def _capacity(model_name: str, gpu_name: str, tp: int, role: str, link: costmodel.LinkCost, prompt: int,
              output: int, ttft_ms: float, tpot_ms: float) -> float | None:
    model, gpu = catalog.model(model_name), catalog.gpu(gpu_name)
    if not costmodel.fits(model, gpu.memory_gb, tp):
        return None
    if role == "prefill":
        option = sizing.prefill_option(model, gpu, tp, link, prompt, ttft_ms, 0.0)
    elif role == "decode":
        option = sizing.decode_option(model, gpu, tp, link, prompt, output, tpot_ms)
    else:
        option = sizing.mixed_option(model, gpu, tp, link, prompt, output, ttft_ms, tpot_ms)
    return None if option is None else option.goodput_rps
