"""A prefill/decode pair's KV path as a transport fault leaves it (issue 34), for the simulated
engine and the offline simulator alike:

    transport "tcp"      the KV moves at TCP speed whatever the path (UCX/NIXL fell back to TCP
                         when RDMA or CUDA IPC was not set up): each rank pair's path becomes the
                         cost model's TCP path (`topology.kinds.DEFAULTS[TCP]`: 100 GbE, 12.5 GB/s,
                         30 us), and every rank pair shares one TCP carrier (UCX's TCP transport
                         takes the host's one interface, not the GPUs' rails)
    bandwidth_factor     the share of the path's KV rate left (0.5: NIXL picked the NIC on the
                         other socket, the bytes cross the inter-socket link)

Pure: paths in, paths and rates out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from physics import kvtransfer
from physics.catalog import ModelSpec
from topology import LinkKind, Path
from topology.kinds import DEFAULTS

TRANSPORTS = ("default", "tcp")
TCP_CARRIER = "tcp fallback: the host's TCP interface"


@dataclass(frozen=True, slots=True, kw_only=True)
class KvPathFault:
    transport: str = "default"
    """default: the path's own transport; tcp: the TCP fallback (module docstring)."""
    bandwidth_factor: float = 1.0
    """Share of the KV rate left, in (0, 1]."""

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise ValueError(f"kv transport {self.transport!r}: one of {', '.join(TRANSPORTS)}")
        if not 0 < self.bandwidth_factor <= 1:
            raise ValueError(f"kv bandwidth factor {self.bandwidth_factor}: in (0, 1]")

    @property
    def active(self) -> bool:
        return self.transport != "default" or self.bandwidth_factor != 1.0

    def path(self, p: Path) -> Path:
        """The path the bytes really take (a local one stays local: nothing moves)."""
        if self.transport != "tcp" or p.tier == "local":
            return p
        tcp = DEFAULTS[LinkKind.TCP]
        return replace(p, kind=LinkKind.TCP, tier="tcp", bandwidth_gb_s=tcp.bandwidth_gb_s, latency_us=tcp.latency_us,
                       via=TCP_CARRIER)

    def rate_gb_s(self, p: Path) -> float:
        """One flow's KV rate on `p` under the fault (`kvtransfer.kv_rate_gb_s`)."""
        return kvtransfer.kv_rate_gb_s(self.path(p)) * self.bandwidth_factor

    def setup_ms(self, p: Path) -> float:
        return kvtransfer.kv_setup_ms(self.path(p))

    def handover_ms(self, model: ModelSpec, tokens: int, paths: Sequence[Path]) -> float:
        """`kvtransfer.kv_handover_ms` over the paths the bytes really take."""
        return kvtransfer.kv_handover_ms(model, tokens, [self.path(p) for p in paths], self.bandwidth_factor)


NO_FAULT = KvPathFault()
