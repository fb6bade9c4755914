"""The engine's decode fast-forward (the offline simulator's): many identical decode steps at once.

While every running request decodes and nothing could change the batch, the steps ahead differ
only in the context they read, so they are planned together (`decode_plan`, a `DecodeRun`: when
each step ends) instead of one `EngineCore.step()` at a time; each is exactly what `step()` would
do. Planning changes nothing: `EngineCore.apply_decode` commits a prefix of the plan.

Pure: it reads the engine through the protocols below (`simengine.core` imports this module,
never the reverse).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from physics import costmodel
from physics.catalog import GpuSpec, ModelSpec
from physics.costmodel import Efficiency, LinkCost
from physics.gang import GangCost, GangDecode


@dataclass(frozen=True, slots=True)
class DecodeRun:
    start_s: float
    ends_s: tuple[float, ...]
    """When each step ends."""
    rids: tuple[str, ...]
    """The requests that produce one token at the end of every step."""

    @property
    def steps(self) -> int:
        return len(self.ends_s)

    def steps_by(self, t: float) -> int:
        """Steps finished by `t`, counting the one in progress then (it completes)."""
        return min(len(self.ends_s), bisect_left(self.ends_s, t) + 1)


class _Seq(Protocol):
    """What the plan reads of a request (`simengine.core.Seq`)."""

    @property
    def rid(self) -> str: ...
    @property
    def max_tokens(self) -> int: ...
    @property
    def ready_s(self) -> float: ...
    @property
    def computed(self) -> int: ...
    @property
    def output(self) -> int: ...
    @property
    def blocks(self) -> int: ...
    def need(self) -> int: ...


class _Config(Protocol):
    """... of the engine's configuration (`simengine.core.EngineConfig`)."""

    @property
    def model(self) -> ModelSpec: ...
    @property
    def gpu(self) -> GpuSpec: ...
    @property
    def tp(self) -> int: ...
    @property
    def max_num_batched_tokens(self) -> int: ...
    @property
    def efficiency(self) -> Efficiency: ...
    @property
    def gang(self) -> GangCost | None: ...


class _Engine(Protocol):
    """... and of the engine (`simengine.core.EngineCore`)."""

    @property
    def config(self) -> _Config: ...
    @property
    def now(self) -> float: ...
    @property
    def running(self) -> Sequence[_Seq]: ...
    @property
    def waiting(self) -> Sequence[_Seq]: ...
    @property
    def free_blocks(self) -> int: ...
    @property
    def slowdown(self) -> float: ...
    @property
    def link(self) -> LinkCost: ...
    def _blocks_for(self, tokens: int) -> int: ...


def decode_plan(core: _Engine, until_s: float, max_steps: int = 1 << 30) -> DecodeRun | None:
    """The back-to-back pure-decode steps that can run while nothing could change the batch:
    every running request is decoding and has produced a token, nobody waiting is ready, no
    request finishes (the step where one would is left to `EngineCore.step()`), and the KV cache
    has room for every step's growth. Stops after the step in progress at `until_s`. Each step is
    exactly what `step()` would do. Changes nothing: `EngineCore.apply_decode` commits a prefix of it."""
    running = core.running
    if not running or len(running) > core.config.max_num_batched_tokens \
            or any(s.ready_s <= core.now for s in core.waiting):
        return None
    if core.waiting:
        until_s = min(until_s, *(s.ready_s for s in core.waiting))
    remaining = max_steps
    context = 0
    for seq in running:
        if seq.output < 1 or seq.need() != 1:
            return None
        remaining = min(remaining, seq.max_tokens - seq.output - 1)
        context += seq.computed
    if remaining <= 0:
        return None
    steps = steps_with_room(core, remaining)
    if steps <= 0:
        return None
    cfg, n = core.config, len(running)
    cost: costmodel.DecodeStep | GangDecode = costmodel.DecodeStep.of(
        cfg.model, cfg.gpu, cfg.tp, core.link, n, cfg.efficiency) if cfg.gang is None else \
        GangDecode(cfg.model, cfg.gpu, cfg.tp, core.link, cfg.gang, n, cfg.efficiency)
    now, ends, slowdown = core.now, [], core.slowdown
    for _ in range(steps):
        now += cost.ms(context) * slowdown / 1000.0
        ends.append(now)
        context += n
        if now >= until_s:
            break
    return DecodeRun(start_s=core.now, ends_s=tuple(ends), rids=tuple(s.rid for s in running))


def steps_with_room(core: _Engine, limit: int) -> int:
    """The most decode steps (up to `limit`) whose KV growth fits the free blocks."""
    def blocks_needed(k: int) -> int:
        return sum(max(0, core._blocks_for(s.computed + k) - s.blocks) for s in core.running)

    if blocks_needed(limit) <= core.free_blocks:
        return limit
    lo, hi = 0, limit  # blocks_needed(lo) fits, blocks_needed(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if blocks_needed(mid) <= core.free_blocks:
            lo = mid
        else:
            hi = mid
    return lo
