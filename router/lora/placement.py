"""Where a LoRA adapter's requests go, and where it is loaded when no replica has it: pure, no
I/O, no clock of its own (times come in), same input same plan.

- Affinity: the usable replicas of the adapter's base model that hold it, least loaded first.
- None holds it: load it on the least-loaded usable replica with room (fewer than `max_loras`
  adapters: its engines' --max-cpu-loras, vLLM's default --max-loras), ties by replica id.
- None has room: unload the coldest adapter (least recently used; one never used here is
  coldest) and load it there; between equally cold ones, the less loaded replica, then the id.
  Requests in flight with the adapter unloaded finish (vLLM's unload only forgets the name; the
  engine keeps the weights it is using).

Load is a replica's sequences (`filters.occupied`: running + waiting as scraped, or this router's
own open ones if more). `AdapterBook` is the router's memory of who holds what and when each was
last used, changed only by what the I/O side reports (`router.lora.manager`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from router.plugins.filters import occupied, usable
from router.plugins.model import Candidate

PlanKind = Literal["held", "load", "evict", "none"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LoraPlan:
    kind: PlanKind
    replicas: tuple[str, ...] = ()
    """held: the holders, best first; load / evict: the one replica to load it on."""
    evict: str | None = None
    """evict: the adapter to unload there first."""
    reason: str = ""


@dataclass(slots=True)
class AdapterBook:
    """replica id -> adapter -> when it was last used (seconds, any monotonic clock; 0: never)."""

    held: dict[str, dict[str, float]] = field(default_factory=dict)

    def on(self, replica: str) -> Mapping[str, float]:
        return self.held.get(replica, {})

    def holders(self, adapter: str) -> list[str]:
        return sorted(r for r, names in self.held.items() if adapter in names)

    def loaded(self, replica: str, adapter: str, now: float) -> None:
        self.held.setdefault(replica, {})[adapter] = now

    def unloaded(self, replica: str, adapter: str) -> None:
        self.held.get(replica, {}).pop(adapter, None)

    def used(self, replica: str, adapter: str, now: float) -> None:
        names = self.held.get(replica)
        if names is not None and adapter in names:
            names[adapter] = max(names[adapter], now)

    def learn(self, replica: str, names: Iterable[str]) -> None:
        """What the replica's engine says it has (its /v1/models): new ones join as never used, the
        ones it no longer has leave."""
        now_held = set(names)
        mine = self.held.setdefault(replica, {})
        for gone in [n for n in mine if n not in now_held]:
            del mine[gone]
        for name in now_held:
            mine.setdefault(name, 0.0)

    def keep(self, replicas: Iterable[str]) -> None:
        """Forget replicas that left the routing table."""
        alive = set(replicas)
        for gone in [r for r in self.held if r not in alive]:
            del self.held[gone]


def base_candidates(snapshot: Sequence[Candidate], base: str, sheddable: bool) -> list[Candidate]:
    """The replicas that could serve an adapter of `base` now (whole requests: mixed or decode)."""
    return [c for c in snapshot if c.endpoint.model == base and c.endpoint.role != "prefill" and usable(c, sheddable)]


def _key(c: Candidate) -> tuple[float, str]:
    return occupied(c), c.endpoint.replica_id


def place(adapter: str, candidates: Sequence[Candidate], book: AdapterBook, max_loras: int) -> LoraPlan:
    """The plan for a request of `adapter` over `candidates` (`base_candidates`)."""
    holders = [c for c in candidates if adapter in book.on(c.endpoint.replica_id)]
    if holders:
        ranked = tuple(c.endpoint.replica_id for c in sorted(holders, key=_key))
        return LoraPlan(kind="held", replicas=ranked, reason=f"{adapter} held by {', '.join(ranked)}")
    if not candidates:
        return LoraPlan(kind="none", reason=f"no usable replica of the base model for {adapter}")
    room = [c for c in candidates if len(book.on(c.endpoint.replica_id)) < max_loras]
    if room:
        best = min(room, key=_key)
        rid = best.endpoint.replica_id
        return LoraPlan(kind="load", replicas=(rid,), reason=f"load {adapter} on {rid}: least loaded with room "
                        f"({len(book.on(rid))}/{max_loras} adapters, {occupied(best):g} sequences)")
    victims = [(last, occupied(c), c.endpoint.replica_id, name) for c in candidates
               for name, last in book.on(c.endpoint.replica_id).items()]
    last, _, rid, name = min(victims)  # every candidate is full: each holds at least one
    return LoraPlan(kind="evict", replicas=(rid,), evict=name,
                    reason=f"load {adapter} on {rid} in place of {name}, the coldest (last used at {last:.3f} s)")
