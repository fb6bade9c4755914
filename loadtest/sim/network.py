"""KV transfers over the topology with contention: every flow crosses named resources (a NIC's
send or receive side, an NVLink pair, a PCIe path) and shares each one fairly with the other
flows on it (processor sharing); a flow's rate is its tightest share. A transfer is one flow per
GPU pair (rails), done when its slowest flow is."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from physics import kvtransfer
from physics.catalog import ModelSpec
from physics.kvpath import NO_FAULT, KvPathFault
from topology import GpuRef, Topology, path
from topology.paths import Path

EPS_S = 1e-12
Leg = tuple[float, tuple[str, ...], float | tuple[float, ...]]


@dataclass(slots=True, eq=False)
class Flow:
    transfer: int
    gb_left: float
    resources: tuple[str, ...]
    rate_gb_s: float = 0.0


@dataclass(slots=True)
class _Transfer:
    flows: int


@dataclass(slots=True)
class Network:
    capacity_gb_s: dict[str, float] = field(default_factory=dict)
    flows: list[Flow] = field(default_factory=list)
    transfers: dict[int, _Transfer] = field(default_factory=dict)
    now: float = 0.0
    version: int = 0
    """Bumped whenever rates change: a scheduled completion from an older version is stale."""

    def start(self, t: float, tid: int, legs: Sequence[Leg]) -> None:
        """Start transfer `tid` at `t`: legs of (GB, resources, resource capacity GB/s: one for
        all, or one per resource)."""
        self._advance(t)
        live = [(gb, res, cap) for gb, res, cap in legs if gb > 0 and res]
        if not live:
            raise ValueError("a transfer with nothing to move needs no network")
        self.transfers[tid] = _Transfer(flows=len(live))
        for gb, res, cap in live:
            for r, c in zip(res, cap if isinstance(cap, tuple) else (cap,) * len(res), strict=True):
                self.capacity_gb_s.setdefault(r, c)
            self.flows.append(Flow(transfer=tid, gb_left=gb, resources=res))
        self._rates()

    def next_done(self) -> float | None:
        """When the next flow finishes at current rates."""
        best = math.inf
        for f in self.flows:
            if f.rate_gb_s > 0:
                best = min(best, self.now + f.gb_left / f.rate_gb_s)
        return None if math.isinf(best) else best

    def finish_due(self, t: float) -> list[int]:
        """Advance to `t`; the transfers whose last flow has finished (their data is there after
        the path latency, which the caller adds)."""
        self._advance(t)
        done = [f for f in self.flows if f.gb_left <= 1e-9]
        if not done:
            return []
        finished = []
        for f in done:
            self.flows.remove(f)
            tr = self.transfers[f.transfer]
            tr.flows -= 1
            if tr.flows == 0:
                finished.append(f.transfer)
                del self.transfers[f.transfer]
        self._rates()
        return finished

    def _advance(self, t: float) -> None:
        dt = t - self.now
        if dt > 0:
            for f in self.flows:
                f.gb_left = max(0.0, f.gb_left - f.rate_gb_s * dt)
        self.now = max(self.now, t)

    def _rates(self) -> None:
        users: dict[str, int] = {}
        for f in self.flows:
            for r in f.resources:
                users[r] = users.get(r, 0) + 1
        for f in self.flows:
            f.rate_gb_s = min(self.capacity_gb_s[r] / users[r] for r in f.resources)
        self.version += 1


def resources(p: Path, a: GpuRef, b: GpuRef) -> tuple[str, ...]:
    """What a flow between two GPUs occupies: the sending and the receiving NIC between nodes
    ('<tech> nodeA/nicA -> nodeB/nicB'), else the path itself (an NVLink pair, a PCIe route)."""
    if p.tier == "local":
        return ()
    if a.node != b.node and " -> " in p.via:
        src, dst = p.via.split(" -> ", 1)
        return (f"{src.rsplit(' ', 1)[-1]}:send", f"{dst}:recv")
    return (f"{a.node}:{p.via or f'{a.index}-{b.index}'}",)


def legs(topology: Topology, source: Sequence[GpuRef], target: Sequence[GpuRef], total_gb: float,
         fault: KvPathFault = NO_FAULT, model: ModelSpec | None = None) -> tuple[list[Leg], float]:
    """One leg per GPU pair (each moves its shard of the KV) at the rate a KV transfer reaches on
    its path, and the worst path's latency plus setup (s): the cost model's KV physics
    (`kvtransfer.kv_rate_gb_s`, `kv_setup_ms`), shared here under contention. A pair's transport
    fault (`physics.kvpath`) adds one more resource to each leg, the faulted rate of its carrier
    (legs on one carrier share it, as they share the carrier), so the slower of the two decides.
    With the `model`, the latency includes the connector's per-layer transfer requests queued on
    the busiest NIC (`kvtransfer.kv_requests_ms`), as the router and the engine price them."""
    pairs = list(zip(source, target, strict=False)) or [(source[0], target[0])]
    out: list[Leg] = []
    latency = 0.0
    crossing: list[Path] = []
    for a, b in pairs:
        p = path(topology, a, b)
        if p.tier == "local":
            continue
        crossing.append(p)
        res, rate = resources(p, a, b), NO_FAULT.rate_gb_s(p)
        if fault.active:  # the carriers keep their own capacity; the fault's resource has the faulted rate
            tag = f"tcp x{fault.bandwidth_factor} {a.node}>{b.node}" if fault.transport == "tcp" else \
                f"x{fault.bandwidth_factor} {a.node}>{b.node} {res[0]}"  # TCP: one carrier for all ranks
            out.append((total_gb / len(pairs), (*res, tag), (*(rate,) * len(res), fault.rate_gb_s(p))))
        else:
            out.append((total_gb / len(pairs), res, rate))
        latency = max(latency, fault.setup_ms(p) / 1e3)
    if model is not None:
        latency += kvtransfer.kv_requests_ms(model, crossing) / 1e3
    return out, latency
