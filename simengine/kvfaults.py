"""The KV-transfer faults of a decode engine (the reader of the KV, as NIXL's decode pulls it),
set through POST /admin/faults with the engine's other faults (`simengine.faults`):

    {"kv_transport": "tcp"}          every remote prefill's KV moves at TCP speed ("default": back)
    {"kv_bandwidth_factor": 0.5}     half the KV rate (a NIC on the other socket)
    {"kv_fail_rate": 0.2}            a fifth of the KV reads fail (`simengine.kvread`)
    {"kv_peer": "prefill-0", ...}    the kv_* fields of this request for that prefill engine only
                                     (its `remote_engine_id`, or `host:port`); it then keeps its own
                                     settings, the others the engine-wide ones
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from physics.kvpath import NO_FAULT, TRANSPORTS, KvPathFault

FIELDS = frozenset({"kv_transport", "kv_bandwidth_factor", "kv_fail_rate", "kv_peer"})


@dataclass(frozen=True, slots=True, kw_only=True)
class KvFault:
    path: KvPathFault = NO_FAULT
    fail_rate: float = 0.0

    def describe(self) -> dict[str, Any]:
        return {"kv_transport": self.path.transport, "kv_bandwidth_factor": self.path.bandwidth_factor,
                "kv_fail_rate": self.fail_rate}


class KvFaults:
    def __init__(self) -> None:
        self.default = KvFault()
        self.peers: dict[str, KvFault] = {}

    def describe(self) -> dict[str, Any]:
        return {**self.default.describe(), "kv_peers": {p: f.describe() for p, f in sorted(self.peers.items())}}

    @staticmethod
    def validate(spec: dict[str, Any]) -> None:
        """Every kv_* field checked before anything changes (`_updated` raises what is wrong)."""
        KvFaults._updated(KvFault(), spec)
        if "kv_peer" in spec and (not isinstance(spec["kv_peer"], str) or not spec["kv_peer"]):
            raise ValueError("kv_peer is a prefill engine's id (or host:port)")

    @staticmethod
    def _updated(fault: KvFault, spec: dict[str, Any]) -> KvFault:
        transport = spec.get("kv_transport", fault.path.transport)
        if transport not in TRANSPORTS:
            raise ValueError(f"kv_transport must be one of {', '.join(TRANSPORTS)}")
        factor = float(spec.get("kv_bandwidth_factor", fault.path.bandwidth_factor))
        rate = float(spec.get("kv_fail_rate", fault.fail_rate))
        if not math.isfinite(factor) or not 0 < factor <= 1:
            raise ValueError("kv_bandwidth_factor must be in (0, 1]")
        if not math.isfinite(rate) or not 0 <= rate <= 1:
            raise ValueError("kv_fail_rate must be in [0, 1]")
        return replace(fault, path=KvPathFault(transport=str(transport), bandwidth_factor=factor), fail_rate=rate)

    def apply(self, spec: dict[str, Any]) -> None:
        if not FIELDS & set(spec):
            return
        peer = spec.get("kv_peer")
        if peer is None:
            self.default = self._updated(self.default, spec)
        else:
            self.peers[str(peer)] = self._updated(self.peers.get(str(peer), self.default), spec)

    def of(self, engine_id: str, address: str) -> KvFault:
        """The fault on reads from this prefill engine (by id, then by host:port)."""
        return self.peers.get(engine_id) or self.peers.get(address) or self.default
