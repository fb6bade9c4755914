"""Domain-local replica choice. vLLM's MoE router picks an expert's copy as
`logical_to_physical_map[expert][hash(token) % logical_replica_count[expert]]`, from lists every
rank holds for itself, which vLLM rewrites from the physical-to-logical map each time it commits
one (`eplb_state._commit_eplb_maps`, and `_commit_eplb_maps_for_layer` on the async path). The
plugin wraps those two functions: after vLLM's commit, this rank's lists hold only the copies
inside its own NVLink domain (all copies where its domain has none), so vLLM's router is
domain-local with no change to its kernel.

Only where each token is mapped on its own rank: when vLLM dispatches router logits to every
rank instead (`do_naive_dispatch_combine`: data parallel with a quantisation method that has no
modular kernel), every rank maps every token and must map it alike, so the lists stay vLLM's.
The lists vLLM builds when the model is added are vLLM's until the first rearrangement.

What vLLM would need to do this without wrappers: a rank (or rank-to-domain map) argument to
`compute_logical_maps`, or a policy method returning per-rank replica lists that the commits use
(docs/experts.md)."""

from __future__ import annotations

from typing import Any

import torch

from pools.experts.engine import ExpertSpec, local_replicas
from vllmplugin.log import logger


def install(spec: ExpertSpec) -> None:
    """Wrap vLLM's two commits (once per process)."""
    from vllm.distributed.eplb import eplb_state

    if getattr(eplb_state, "isleserve_locality", None) is not None:
        return
    commit, commit_layer = eplb_state._commit_eplb_maps, eplb_state._commit_eplb_maps_for_layer

    def commit_maps(model_state: Any, new_physical_to_logical_map: torch.Tensor) -> None:
        commit(model_state, new_physical_to_logical_map)
        rewrite(spec, model_state, new_physical_to_logical_map, None)

    def commit_layer_maps(model_state: Any, new_physical_to_logical_map: torch.Tensor, layer: int) -> None:
        commit_layer(model_state, new_physical_to_logical_map, layer)
        rewrite(spec, model_state, new_physical_to_logical_map, layer)

    eplb_state._commit_eplb_maps = commit_maps
    eplb_state._commit_eplb_maps_for_layer = commit_layer_maps
    eplb_state.isleserve_locality = spec


def rewrite(spec: ExpertSpec, model_state: Any, physical_to_logical: torch.Tensor, layer: int | None) -> None:
    """This rank's lists after vLLM committed `physical_to_logical` (all layers, or `layer`)."""
    rank = _rank(spec)
    if rank is None or physical_to_logical.shape[-1] % spec.ranks or naive_dispatch(model_state.model):
        return
    lists, counts = model_state.logical_to_physical_map, model_state.logical_replica_count
    if layer is not None:
        lists, counts = lists[layer], counts[layer]
    logical, count = localise(spec, rank, physical_to_logical.cpu(), lists.shape[-2], counts.dtype)
    padded = torch.full(lists.shape, -1, dtype=lists.dtype)
    padded[..., :logical.shape[-1]] = logical
    from vllm.utils.gpu_sync_debug import gpu_sync_allowed

    with gpu_sync_allowed():
        lists.copy_(padded)
        counts.copy_(count)


def naive_dispatch(model: Any) -> bool:
    """Whether any MoE layer maps every rank's tokens on every rank (module docstring)."""
    naive = any(bool(getattr(layer, "do_naive_dispatch_combine", False)) for layer in getattr(model, "moe_layers", ()))
    if naive:
        logger.warning("vLLM dispatches router logits to every rank here (no modular MoE kernel): each rank keeps "
                       "vLLM's replica lists, not its domain's")
    return naive


def localise(spec: ExpertSpec, rank: int, physical_to_logical_map: torch.Tensor, experts: int,
             dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's two lists (`compute_logical_maps`' shapes) for `rank`: its domain's copies only."""
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
