"""The physical graph: GPUs, NICs, links, nodes, islands and the cluster topology.

All types are frozen; an update returns a new object (`dataclasses.replace`). GPUs are named
within a node by their NVML/PCI index, and across the cluster by `GpuRef(node, index)`.
Links join two GPUs of one node (a < b). GPUs of different nodes are joined by the inter-node
fabric, or, when they share an NVLink fabric clique (GB200 NVL72), by NVLink through switches.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from topology.kinds import LinkKind, default_bandwidth_gb_s, default_latency_us


class GpuRef(NamedTuple):
    """A GPU anywhere in the cluster (a tuple: cheap to hash, which placement does a lot)."""

    node: str
    index: int  # type: ignore[assignment]  # shadows tuple.index on purpose: the GPU's index

    def __str__(self) -> str:
        return f"{self.node}:gpu{self.index}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Gpu:
    index: int
    model: str | None = None
    pci_bus_id: str | None = None
    uuid: str | None = None
    numa_node: int | None = None
    """CPU-side NUMA node (NUMA Affinity); None when unknown (VMs print N/A)."""
    cpu_affinity: str | None = None
    """CPU list as nvidia-smi prints it, e.g. '0-55,112-167'."""
    gpu_numa_node: int | None = None
    """NUMA node of the GPU's own memory (Grace Hopper/Blackwell); not for CPU pinning."""
    memory_gb: float | None = None
    nvlink_generation: int | None = None
    fabric_clique: str | None = None
    """'<cluster uuid>/<clique id>' when the GPU belongs to a multi-node NVLink domain."""
    healthy: bool = True
    health_reasons: tuple[str, ...] = ()
    pcie_factor: float = 1.0
    """Share of its PCIe bandwidth the GPU still has (width trained down, replays): scales the
    paths that leave the GPU over PCIe (to NICs and host), also on NVSwitch boards."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Nic:
    name: str
    nearest_gpus: tuple[int, ...] = ()
    level: LinkKind = LinkKind.SYS
    """PCIe level between the NIC and its nearest GPUs (pix..sys)."""
    pci_bus_id: str | None = None
    numa_node: int | None = None
    speed_gbit_s: float | None = None
    link_layer: str | None = None
    """'infiniband', 'ethernet' (RoCE/TCP) or 'efa'; None when the source does not say."""
    gpu_levels: tuple[tuple[int, LinkKind], ...] = ()
    """PCIe level to every GPU, when the source gives it (captures, NCCL XML, NVML)."""

    def level_to(self, gpu: int) -> LinkKind | None:
        for index, level in self.gpu_levels:
            if index == gpu:
                return level
        return self.level if gpu in self.nearest_gpus else None


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkHealth:
    score: float = 1.0
    """1.0 healthy .. 0.0 down; see topology.health for how counters map to it."""
    healthy: bool = True
    """False when the score fell below the configured threshold: the link leaves its island."""
    bandwidth_factor: float = 1.0
    added_latency_us: float = 0.0
    reasons: tuple[str, ...] = ()


HEALTHY = LinkHealth()


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    a: int
    b: int
    kind: LinkKind
    lanes: int | None = None
    """NVLink lanes (the # of NV#); None for other kinds."""
    bandwidth_gb_s: float = 0.0
    """Nominal (or measured) per-direction bandwidth; 0 means 'use the kind's default'."""
    latency_us: float = 0.0
    health: LinkHealth = HEALTHY

    def __post_init__(self) -> None:
        if self.a >= self.b:
            raise ValueError(f"link endpoints must satisfy a < b, got {self.a}-{self.b}")
        if self.bandwidth_gb_s <= 0:
            object.__setattr__(self, "bandwidth_gb_s", default_bandwidth_gb_s(self.kind, self.lanes))
        if self.latency_us <= 0:
            object.__setattr__(self, "latency_us", default_latency_us(self.kind))

    @property
    def effective_bandwidth_gb_s(self) -> float:
        return self.bandwidth_gb_s * self.health.bandwidth_factor

    @property
    def effective_latency_us(self) -> float:
        return self.latency_us + self.health.added_latency_us

    @property
    def joins_island(self) -> bool:
        """A healthy NVLink/NVSwitch/XGMI link: the edges islands are built from."""
        return self.kind.is_gpu_fabric and self.health.healthy


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    name: str
    gpus: tuple[Gpu, ...]
    nics: tuple[Nic, ...] = ()
    links: tuple[Link, ...] = ()
    rack: str | None = None
    machine: str | None = None
    """Template name or a description of where the node came from."""
    source_format: str = "declared"
    notes: tuple[str, ...] = ()
    """What the reader could not tell from its input (shown to the user as warnings)."""
    _by_pair: dict[tuple[int, int], Link] = field(init=False, repr=False, compare=False)
    _by_index: dict[int, Gpu] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_index = {g.index: g for g in self.gpus}
        if len(by_index) != len(self.gpus):
            raise ValueError(f"node {self.name}: duplicate GPU index")
        for nic in self.nics:
            missing = [g for g in nic.nearest_gpus if g not in by_index]
            if missing:
                raise ValueError(f"node {self.name}: NIC {nic.name} names unknown GPUs {missing}")
        by_pair: dict[tuple[int, int], Link] = {}
        for link in self.links:
            if link.a not in by_index or link.b not in by_index:
                raise ValueError(f"node {self.name}: link {link.a}-{link.b} names an unknown GPU")
            if (link.a, link.b) in by_pair:
                raise ValueError(f"node {self.name}: two links for GPU{link.a}-GPU{link.b}")
            by_pair[(link.a, link.b)] = link
        object.__setattr__(self, "_by_index", by_index)
        object.__setattr__(self, "_by_pair", by_pair)

    def gpu(self, index: int) -> Gpu:
        return self._by_index[index]

    def has_gpu(self, index: int) -> bool:
        return index in self._by_index

    def link(self, a: int, b: int) -> Link | None:
        """The link between two GPUs of this node, in either order; None if not recorded."""
        return self._by_pair.get((a, b) if a < b else (b, a))

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return tuple(sorted(self._by_index))


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredPath:
    """What a benchmark measured between two nodes (one representative GPU pair, one direction)."""

    a: str
    b: str
    """Node names, a < b."""
    bandwidth_gb_s: float
    latency_us: float

    def __post_init__(self) -> None:
        if self.a >= self.b:
            raise ValueError(f"measured path endpoints must satisfy a < b, got {self.a!r}, {self.b!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Fabric:
    """The network between nodes."""

    kind: LinkKind = LinkKind.RDMA
    technology: str = "ib-ndr"
    nic_bandwidth_gb_s: float = 50.0
    """Per-NIC per-direction bandwidth used when a node's NICs do not state a speed."""
    latency_us: float = 3.0
    inter_rack_bandwidth_factor: float = 0.5
    """Share of NIC bandwidth left across racks (spine oversubscription)."""
    inter_rack_latency_us: float = 2.0
    """Extra latency for a path that crosses racks (one more switch tier each way)."""
    measured: tuple[MeasuredPath, ...] = ()
    """Node pairs a benchmark measured: their paths take these values instead of the estimate
    from NIC speeds (not part of the fingerprint: the structure did not change)."""

    def __post_init__(self) -> None:
        if not self.kind.is_network:
            raise ValueError(f"fabric kind must be rdma or tcp, got {self.kind.label}")

    def measured_between(self, a: str, b: str) -> MeasuredPath | None:
        lo, hi = (a, b) if a < b else (b, a)
        return next((m for m in self.measured if m.a == lo and m.b == hi), None)


@dataclass(frozen=True, slots=True, kw_only=True)
class Island:
    """A maximal set of GPUs joined by healthy NVLink/NVSwitch/XGMI links."""

    id: str
    gpus: tuple[GpuRef, ...]
    kind: LinkKind | None
    """Best fabric kind inside (NVSWITCH, NVLINK or XGMI); None for a single GPU."""
    fully_connected: bool
    bottleneck_gb_s: float
    """Lowest effective bandwidth between two members (0 for a singleton)."""

    @property
    def size(self) -> int:
        return len(self.gpus)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(sorted({g.node for g in self.gpus}))


@dataclass(frozen=True, slots=True, kw_only=True)
class Topology:
    nodes: tuple[Node, ...]
    fabric: Fabric = Fabric()
    name: str = ""
    _by_name: dict[str, Node] = field(init=False, repr=False, compare=False)
    _fingerprint: list[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name = {n.name: n for n in self.nodes}
        if len(by_name) != len(self.nodes):
            raise ValueError("duplicate node name in topology")
        object.__setattr__(self, "_by_name", by_name)
        object.__setattr__(self, "_fingerprint", [])

    def node(self, name: str) -> Node:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no node named {name!r}") from None

    def has_node(self, name: str) -> bool:
        return name in self._by_name

    def gpu(self, ref: GpuRef) -> Gpu:
        return self.node(ref.node).gpu(ref.index)

    def gpu_refs(self) -> list[GpuRef]:
        return [GpuRef(n.name, g.index) for n in self.nodes for g in n.gpus]

    @property
    def gpu_count(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)

    def fingerprint(self) -> str:
        """Stable id of the structure: same for any ordering, changes when a link changes."""
        if not self._fingerprint:  # computed once: the topology is immutable
            self._fingerprint.append(fingerprint(self))
        return self._fingerprint[0]


def _node_digest(node: Node) -> str:
    hit = _DIGESTS.get(id(node))
    if hit is not None and hit[0] is node:
        return hit[1]
    blob = json.dumps(_canonical_node(node), sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(blob.encode()).hexdigest()
    _DIGESTS[id(node)] = (node, digest)
    if len(_DIGESTS) > 16384:
        _DIGESTS.pop(next(iter(_DIGESTS)))
    return digest


_DIGESTS: dict[int, tuple[Node, str]] = {}


def _canonical_node(node: Node) -> dict[str, Any]:
    return {
        "name": node.name,
        "rack": node.rack,
        "gpus": [
            [g.index, g.model, g.pci_bus_id, g.numa_node, g.fabric_clique, g.healthy]
            for g in sorted(node.gpus, key=lambda g: g.index)
        ],
        "nics": [
            [n.name, sorted(n.nearest_gpus), n.level.name, n.speed_gbit_s]
            for n in sorted(node.nics, key=lambda n: n.name)
        ],
        "links": [
            [k.a, k.b, k.kind.name, k.lanes, k.health.healthy]
            for k in sorted(node.links, key=lambda k: (k.a, k.b))
        ],
    }


def fingerprint(topology: Topology) -> str:
    """sha256 over the fabric kind and each node's digest (cached per node object), sorted."""
    parts = sorted(_node_digest(n) for n in topology.nodes)
    blob = topology.fabric.kind.name + ":" + ",".join(parts)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
