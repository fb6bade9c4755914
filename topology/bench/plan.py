"""What a communication benchmark measures (pure). On one node: host-to-device and
device-to-host copies for each GPU, one peer-to-peer probe per kind of link present between its
GPUs (the first pair of each kind and lane count, as operators pick a representative pair per
tier rather than all 28 pairs of an 8-GPU board) and one all-reduce inside each island of two
or more GPUs. Between two nodes (under Ray, one rank on each): a peer-to-peer probe and a
two-rank all-reduce between each node's first GPU, over the inter-node fabric.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from topology.islands import islands
from topology.model import GpuRef, Topology
from topology.paths import path, tier_of_kind

ProbeKind = Literal["h2d", "d2h", "p2p", "allreduce"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Probe:
    kind: ProbeKind
    node: str
    gpus: tuple[int, ...]
    """One GPU for a copy, a pair for p2p, the island's members for an all-reduce (local indices)."""
    link: str
    """The link kind's label (`nvlink`, `pix`, `sys`, ...) with lanes (`nvlink x18`); `host`."""
    tier: str
    peer: str | None = None
    """Between nodes: the second node (`gpus` is then one GPU on `node`, one on `peer`)."""

    @property
    def name(self) -> str:
        if self.peer is not None:
            return f"{self.kind} {self.node}:GPU{self.gpus[0]}-{self.peer}:GPU{self.gpus[1]}"
        members = "-".join(f"GPU{g}" for g in self.gpus)
        return f"{self.kind} {self.node}:{members}"


def link_label(kind_label: str, lanes: int | None) -> str:
    return f"{kind_label} x{lanes}" if lanes else kind_label


def plan_probes(topology: Topology, node_name: str) -> list[Probe]:
    node = topology.node(node_name)
    seen: set[tuple[str, int | None]] = set()
    probes = [Probe(kind=kind, node=node.name, gpus=(g.index,), link="host", tier="pcie")
              for g in sorted(node.gpus, key=lambda g: g.index) for kind in ("h2d", "d2h")]
    for link in sorted(node.links, key=lambda lk: (lk.a, lk.b)):
        key = (link.kind.label, link.lanes)
        if key in seen:
            continue
        seen.add(key)
        probes.append(Probe(kind="p2p", node=node.name, gpus=(link.a, link.b), link=link_label(*key),
                            tier=tier_of_kind(link.kind)))
    for island in islands(topology):
        members = tuple(sorted(ref.index for ref in island.gpus if ref.node == node.name))
        if len(members) >= 2 and island.kind is not None:
            probes.append(Probe(kind="allreduce", node=node.name, gpus=members, link=island.kind.label,
                                tier=tier_of_kind(island.kind)))
    return probes


def plan_between(topology: Topology, a: str, b: str) -> list[Probe]:
    """A p2p probe and a two-rank all-reduce between the first GPU of node `a` and of node `b`."""
    ga, gb = min(topology.node(a).gpu_indices), min(topology.node(b).gpu_indices)
    route = path(topology, GpuRef(a, ga), GpuRef(b, gb))
    return [Probe(kind=kind, node=a, peer=b, gpus=(ga, gb), link=route.kind.label, tier=route.tier)
            for kind in ("p2p", "allreduce")]
