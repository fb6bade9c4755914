"""A LoRA workload: each request names an adapter, Zipf over the adapters (a few hot, a long cold
tail, as multi-tenant adapter serving sees: S-LoRA and Punica evaluate with power-law adapter
popularity), applied to any workload's requests (`TraceRequest.model`).

Adapter k (0-based, in the order given) is named with weight 1 / (k + 1)^skew; `base_share` of the
requests keep the run's base model (`model` empty). Seeded: the same requests, mix and seed give
the same names (drawn from their own generator, `"{seed}:lora"`), whatever the arrivals.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass

from loadtest.model import TraceRequest
from loadtest.workloads import WorkloadError


@dataclass(frozen=True, slots=True, kw_only=True)
class AdapterMix:
    adapters: tuple[str, ...]
    skew: float = 1.0
    """The Zipf exponent (0: every adapter as likely)."""
    base_share: float = 0.0
    """The share of requests left on the base model."""

    def __post_init__(self) -> None:
        if not self.adapters or len(set(self.adapters)) != len(self.adapters) or not all(self.adapters):
            raise WorkloadError(f"lora.adapters: want distinct non-empty names, got {list(self.adapters)}")
        if not self.skew >= 0:
            raise WorkloadError(f"lora.skew is {self.skew}, must be >= 0")
        if not 0 <= self.base_share < 1:
            raise WorkloadError(f"lora.base_share is {self.base_share}, must be in [0, 1)")

    def weights(self) -> list[float]:
        return [1.0 / (k + 1) ** self.skew for k in range(len(self.adapters))]


def adapter_names(count: int, prefix: str = "lora") -> tuple[str, ...]:
    """`count` adapter names, `lora-0` ... (what `lora: {adapters: N}` asks for)."""
    if count < 1:
        raise WorkloadError(f"lora.adapters is {count}, must be >= 1")
    return tuple(f"{prefix}-{k}" for k in range(count))


def assign_adapters(requests: Sequence[TraceRequest], mix: AdapterMix, seed: int) -> list[TraceRequest]:
    """Each request's model: an adapter drawn by its weight, or (with `base_share`) the base model."""
    rng = random.Random(f"{seed}:lora")
    cumulative = list(itertools.accumulate(mix.weights()))
    out = []
    for r in requests:
        base = rng.random() < mix.base_share
        name = rng.choices(mix.adapters, cum_weights=cumulative)[0]
        out.append(dataclasses.replace(r, model="" if base else name))
    return out
