"""Domain-local replica choice. vLLM's MoE router picks an expert's copy as
`logical_to_physical_map[expert][hash(token) % logical_replica_count[expert]]`, from the lists
vLLM derives from the physical-to-logical map in `eplb_state.compute_logical_maps` when it
commits a map. Every rank holds its own copy of those lists, so giving each rank only the
copies inside its own NVLink domain (all copies when its domain has none) makes vLLM's router
domain-local with no change to the kernel: this wraps that one function. What vLLM would need to
do it without a wrapper: a `rank` argument to `compute_logical_maps` (or a policy hook that
returns per-rank lists) — docs/experts.md."""

from __future__ import annotations

from typing import Any

import torch

from pools.experts.engine import ExpertSpec, local_replicas


def install(spec: ExpertSpec) -> None:
    """Wrap `vllm.distributed.eplb.eplb_state.compute_logical_maps` (once)."""
    from vllm.distributed.eplb import eplb_state

    original = eplb_state.compute_logical_maps
    if getattr(original, "isleserve_spec", None) is not None:
        return

    def compute_logical_maps(physical_to_logical_map: torch.Tensor, num_logical_experts: int) -> Any:
        logical, count = original(physical_to_logical_map, num_logical_experts)
        rank = _rank(spec)
        if rank is None or physical_to_logical_map.shape[-1] % spec.ranks:
            return logical, count
        return localise(spec, rank, physical_to_logical_map, num_logical_experts, count.dtype)

    compute_logical_maps.isleserve_spec = spec  # type: ignore[attr-defined]
    eplb_state.compute_logical_maps = compute_logical_maps


def localise(spec: ExpertSpec, rank: int, physical_to_logical_map: torch.Tensor, experts: int,
             dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """`compute_logical_maps`' two results for `rank`: its domain's copies first and only."""
    single = physical_to_logical_map.dim() == 1
    rows = [physical_to_logical_map.tolist()] if single else physical_to_logical_map.tolist()
    lists = [local_replicas(row, spec.domains, rank, experts) for row in rows]
    width = max(1, *(len(x) for layer in lists for x in layer))
    logical = torch.full((len(rows), experts, width), -1, dtype=physical_to_logical_map.dtype)
    count = torch.zeros((len(rows), experts), dtype=dtype)
    for k, layer in enumerate(lists):
        for e, slots in enumerate(layer):
            count[k, e] = len(slots)
            if slots:
                logical[k, e, :len(slots)] = torch.tensor(slots, dtype=physical_to_logical_map.dtype)
    return (logical[0], count[0]) if single else (logical, count)


def _rank(spec: ExpertSpec) -> int | None:
    try:
        from vllm.distributed.parallel_state import get_ep_group

        group = get_ep_group()
    except (AssertionError, ImportError):
        return None
    rank: int = group.rank_in_group
    return rank if group.world_size == spec.ranks else None
