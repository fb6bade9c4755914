"""Engine ports on a node (pure): every vLLM replica needs an HTTP port and, for the prefill and
decode roles, a NIXL side-channel port, both on the command line (vLLM cannot report a port it
chose itself). The controller hands them out from configured ranges, per node: no two replicas on
one node (a replacement started before its predecessor stops included) share a port, and a
replica keeps its ports for as long as it runs there (the saved state carries them, so a
restarted controller reattaches to the same ones). A port some other process already holds is
reported by the replica (`PortInUse`) and skipped on the next try.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass


class PortInUse(RuntimeError):
    """A replica found its assigned port taken on its node (by a process the controller does not know)."""

    def __init__(self, node: str, port: int) -> None:
        super().__init__(f"port {port} on node {node} is already in use")
        self.node, self.port = node, port

    def __reduce__(self) -> tuple[type[PortInUse], tuple[str, int]]:  # raised inside Ray actors
        return (PortInUse, (self.node, self.port))


class NoFreePort(RuntimeError):
    """Every port of a range is taken on a node."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PortRange:
    first: int
    last: int

    def __post_init__(self) -> None:
        if not 1024 <= self.first <= self.last <= 65535:
            raise ValueError(f"port range {self.first}-{self.last}: want 1024 <= first <= last <= 65535")

    def overlaps(self, other: PortRange) -> bool:
        return self.first <= other.last and other.first <= self.last

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"


@dataclass(frozen=True, slots=True, kw_only=True)
class PortPlan:
    http: PortRange = PortRange(first=8100, last=8199)
    """vLLM's OpenAI servers (below Linux's ephemeral range, away from the router's 8000)."""
    side_channel: PortRange = PortRange(first=5600, last=5699)
    """NIXL handshakes (vLLM's own default is 5600)."""

    def __post_init__(self) -> None:
        if self.http.overlaps(self.side_channel):
            raise ValueError(f"the HTTP ports {self.http} and the NIXL side-channel ports {self.side_channel} overlap")


@dataclass(frozen=True, slots=True, kw_only=True)
class EnginePorts:
    http: int
    side_channel: int | None = None

    def all(self) -> tuple[int, ...]:
        return (self.http,) if self.side_channel is None else (self.http, self.side_channel)

    def to_json(self) -> dict[str, int | None]:
        return {"http": self.http, "side_channel": self.side_channel}

    @classmethod
    def from_json(cls, raw: dict[str, int | None]) -> EnginePorts:
        side = raw.get("side_channel")
        return cls(http=int(raw["http"] or 0), side_channel=int(side) if side is not None else None)


def _lowest_free(r: PortRange, taken: Collection[int], node: str, what: str) -> int:
    for port in range(r.first, r.last + 1):
        if port not in taken:
            return port
    raise NoFreePort(f"node {node}: every {what} port of {r} is taken ({r.last - r.first + 1} ports); "
                     "widen the range in the config's vllm ports")


def allocate(plan: PortPlan, node: str, taken: Collection[int], side_channel: bool) -> EnginePorts:
    """The lowest free ports of each range on `node` (`taken`: what its other replicas hold, and
    ports found busy there)."""
    http = _lowest_free(plan.http, taken, node, "HTTP")
    side = _lowest_free(plan.side_channel, taken, node, "NIXL side-channel") if side_channel else None
    return EnginePorts(http=http, side_channel=side)
