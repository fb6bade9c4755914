"""isleserve's EPLB policy as vLLM calls it (`AbstractEplbPolicy.rebalance_experts`, on every EP
rank, with the load window summed over the ranks): vLLM's own map first (the rival), then
`pools.experts.engine.rebalance`. Every rank computes the same map from the same inputs."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, ClassVar

import torch
from vllm.distributed.eplb.policy.abstract import AbstractEplbPolicy
from vllm.distributed.eplb.policy.default import DefaultEplbPolicy

from pools.experts.engine import LOAD_DIR_ENV, ExpertSpec, load_record, rebalance
from vllmplugin.log import logger


class TopologyEplbPolicy(AbstractEplbPolicy):  # type: ignore[misc]
    spec: ClassVar[ExpertSpec | None] = None
    rival: ClassVar[Any] = DefaultEplbPolicy
    calls: ClassVar[int] = 0

    @classmethod
    def rebalance_experts(cls, weight: torch.Tensor, num_replicas: int, num_groups: int, num_nodes: int,
                          num_ranks: int, old_global_expert_indices: torch.Tensor | None = None) -> torch.Tensor:
        theirs: torch.Tensor = cls.rival.rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_ranks,
                                                           old_global_expert_indices)
        cls.calls += 1
        spec = cls.spec
        if spec is None or spec.ranks != num_ranks:
            logger.warning("the spec names %s EP ranks, vLLM has %d: vLLM's own map",
                           spec.ranks if spec is not None else "no", num_ranks)
            return theirs
        load = weight.float().tolist()
        try:
            old = old_global_expert_indices.tolist() if old_global_expert_indices is not None else None
            ours = rebalance(spec, load, num_replicas, num_groups, theirs.tolist(), old)
        except Exception:  # a failure here must not stop vLLM's EPLB: every rank falls back alike
            logger.exception("EPLB policy failed: vLLM's own map")
            return theirs
        result = torch.tensor(ours, dtype=theirs.dtype, device=theirs.device)
        kept = sum(1 for a, b in zip(ours, theirs.tolist(), strict=True) if a == b)
        logger.info("EPLB policy: %d layers, %d physical experts over %d ranks (%d NVLink domains; vLLM "
                    "counts %d nodes): vLLM's own map kept in %d layers", len(ours), num_replicas, num_ranks,
                    len(set(spec.domains)), num_nodes, kept)
        _record(load, ours, num_replicas=num_replicas, num_groups=num_groups, num_nodes=num_nodes,
                num_ranks=num_ranks, vllm_kept_layers=kept)
        return result


def _record(load: list[list[float]], phys2log: list[list[int]], **meta: Any) -> None:
    """Write the load window (and the map returned) on the EP group's first rank; not the empty
    window of vLLM's start-up profile run. A write that fails is logged, never raised (the other
    ranks would wait for this one in the next collective)."""
    where = os.environ.get(LOAD_DIR_ENV)
    if not where or _ep_rank() not in (0, None) or not any(any(row) for row in load):
        return
    try:
        folder = Path(where)
        folder.mkdir(parents=True, exist_ok=True)
        name = folder / f"eplb-load-{os.getpid()}-{TopologyEplbPolicy.calls}.json"
        doc = load_record(load, **meta, physical_to_logical=phys2log, time=time.time())
        tmp = name.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(name)
    except OSError as err:
        logger.error("EPLB load record not written to %s: %s", where, err)


def _ep_rank() -> int | None:
    try:
        from vllm.distributed.parallel_state import get_ep_group

        rank: int = get_ep_group().rank_in_group
        return rank
    except (AssertionError, ImportError):
        return None
