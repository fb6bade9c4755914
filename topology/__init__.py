"""The physical graph: model, readers (nvidia-smi, rocm-smi, NCCL XML, NVML, cluster specs),
islands and cliques, paths and tiers, link health, drawing and drift, machine templates
(`templates`), communication benchmarks (`bench`) and the config-file helpers every layer uses
(`configfile`). The lowest layer: imports no other package of this project."""

from topology.errors import DiscoveryError, ParseError, TopologyError
from topology.islands import cliques, is_clique, islands
from topology.kinds import LinkKind
from topology.model import Fabric, Gpu, GpuRef, Island, Link, LinkHealth, Nic, Node, Topology
from topology.paths import Path, Tier, bottleneck, path, tier
from topology.readers import ReadOptions, read_source

__all__ = [
    "DiscoveryError", "Fabric", "Gpu", "GpuRef", "Island", "Link", "LinkHealth", "LinkKind", "Nic",
    "Node", "ParseError", "Path", "ReadOptions", "Tier", "Topology", "TopologyError", "bottleneck",
    "cliques", "is_clique", "islands", "path", "read_source", "tier",
]
