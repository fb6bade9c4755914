"""A decode engine's read of a remote prefill's KV, as vLLM's NixlConnector does it, timed by the
cost model over the pair's paths (`simengine.pd.kv_paths`) as the pair's faults leave them
(`simengine.kvfaults`, `physics.kvpath`), and recorded in vLLM's NIXL metrics
(`simengine.nixlmetrics`) when it lands.

A read fails with the peer's `kv_fail_rate`, after its transfer time. vLLM then follows
`kv_load_failure_policy` (vllm/config/kv_transfer.py; vllm/v1/core/sched/scheduler.py): `fail`
(its default) finishes the request with finish_reason "error", which its OpenAI server answers
as a 500 `InternalServerError` "Internal server error" (`GenerationError`); `recompute`
prefills the prompt again on the decode engine. Either way vllm:nixl_num_failed_transfers grows.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from physics import kvtransfer
from physics.catalog import ModelSpec
from simengine import pd
from simengine.faults import Faults
from simengine.nixlmetrics import NixlMetrics
from topology import Topology
from wire.errors import ApiError

POLICIES = ("fail", "recompute")


@dataclass(frozen=True, slots=True, kw_only=True)
class KvRead:
    ms: float
    """The transfer time charged (a failed read's too)."""
    remote_prefill: bool
    """False: the read failed and the decode engine prefills the prompt itself (`recompute`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class KvReader:
    model: ModelSpec
    tp: int
    block_size: int
    topology: Topology | None
    placement: pd.Placement | None
    metrics: NixlMetrics
    faults: Faults
    """The engine's faults (its `kv` ones apply; a `clear` replaces them)."""
    policy: str = "fail"
    time_scale: float = 1.0
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    finished_error: Callable[[], None] = lambda: None
    """A request failed by its read (`fail`): vLLM counts it in vllm:request_success{finished_reason="error"}."""

    async def read(self, params: dict[str, Any], tokens: int) -> KvRead:
        src = params.get("isle_placement")
        source = pd.Placement(node=src["node"], gpus=tuple(src["gpus"])) if isinstance(src, dict) else None
        peer = str(params["remote_engine_id"])
        fault = self.faults.kv.of(peer, f"{params['remote_host']}:{params['remote_port']}")
        paths = pd.kv_paths(self.topology, source, self.placement)
        ms = fault.path.handover_ms(self.model, tokens, paths)
        delay_s = ms / 1000 * self.time_scale
        loop = asyncio.get_running_loop()
        if fault.fail_rate and self.rng.random() < fault.fail_rate:
            if self.policy == "fail":
                await asyncio.sleep(delay_s)
                self.metrics.failure(peer)
                self.finished_error()
                raise ApiError(500, "Internal server error", "InternalServerError")
            loop.call_later(delay_s, self.metrics.failure, peer)
            return KvRead(ms=ms, remote_prefill=False)
        kv_bytes = kvtransfer.kv_bytes(self.model, tokens) * kvtransfer.kv_replication(self.model, len(paths))
        post_s = max(fault.path.setup_ms(p) for p in paths) / 1000
        regions = self.model.layers * (1 if self.model.attention == "mla" else 2)  # K and V apart (FlashAttention)
        blocks = -(-tokens // self.block_size)
        loop.call_later(delay_s, self.metrics.transfer, peer, self.tp, kv_bytes, ms / 1000, post_s, regions * blocks)
        return KvRead(ms=ms, remote_prefill=True)
