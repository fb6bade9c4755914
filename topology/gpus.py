"""GPU interconnect facts by model name (data: topology/data/gpus.yaml, with sources)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources
from typing import Literal

import yaml

from topology.kinds import LinkKind, default_bandwidth_gb_s
from topology.model import Link

Fabric = Literal["nvswitch", "hybrid-cube-mesh", "pairs", "xgmi", "none"]

HYBRID_CUBE_MESH: dict[tuple[int, int], int] = {
    # DGX-1 V100, as every DGX-1 `nvidia-smi topo -m` prints it (shared/data/topo/dgx1-*).
    (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2, (2, 3): 2,
    (2, 6): 1, (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2, (5, 7): 1, (6, 7): 2,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuFacts:
    name: str
    nvlink_generation: int | None
    nvlink_lanes: int
    fabric: Fabric
    pcie_generation: int
    memory_gb: float
    pci_ids: tuple[str, ...]
    xgmi_link_gb_s: float | None = None
    """One Infinity Fabric link's rate per direction (None: the kind's default, MI300X's)."""

    def link_gb_s(self, kind: LinkKind, lanes: int | None = None) -> float:
        """A link of this kind between two GPUs of this model: its NVLink generation, its PCIe
        generation, its Infinity Fabric link rate (`default_bandwidth_gb_s`)."""
        return default_bandwidth_gb_s(kind, lanes, self.nvlink_generation, self.pcie_generation,
                                      xgmi_link_gb_s=self.xgmi_link_gb_s)


@functools.cache
def catalogue() -> dict[str, GpuFacts]:
    raw = yaml.safe_load(resources.files("topology").joinpath("data/gpus.yaml").read_text())
    return {
        name: GpuFacts(name=name, nvlink_generation=v["nvlink_generation"], nvlink_lanes=v["nvlink_lanes"],
                       fabric=v["fabric"], pcie_generation=v["pcie_generation"],
                       memory_gb=float(v["memory_gb"]), pci_ids=tuple(v["pci_ids"]),
                       xgmi_link_gb_s=float(v["xgmi_link_gb_s"]) if v.get("xgmi_link_gb_s") else None)
        for name, v in raw.items()
    }


def gpu_facts(name: str) -> GpuFacts:
    try:
        return catalogue()[name]
    except KeyError:
        known = ", ".join(sorted(catalogue()))
        raise ValueError(f"unknown GPU model {name!r} (known: {known})") from None


def by_pci_id(device_id: str) -> GpuFacts | None:
    wanted = device_id.lower()
    return next((f for f in catalogue().values() if wanted in f.pci_ids), None)


def baseboard_links(facts: GpuFacts, gpu_count: int, fabric: Fabric | None = None) -> list[Link]:
    """The GPU-fabric links of a board of `gpu_count` GPUs of this model (no PCIe links);
    `fabric` overrides the model's usual wiring."""
    fabric = fabric or facts.fabric
    pairs = [(a, b) for a in range(gpu_count) for b in range(a + 1, gpu_count)]
    if fabric == "nvswitch":
        return [Link(a=a, b=b, kind=LinkKind.NVSWITCH, lanes=facts.nvlink_lanes) for a, b in pairs]
    if fabric == "xgmi":
        return [Link(a=a, b=b, kind=LinkKind.XGMI, bandwidth_gb_s=facts.link_gb_s(LinkKind.XGMI)) for a, b in pairs]
    if fabric == "pairs":
        return [Link(a=a, b=a + 1, kind=LinkKind.NVLINK, lanes=facts.nvlink_lanes)
                for a in range(0, gpu_count - 1, 2)]
    if fabric == "hybrid-cube-mesh" and gpu_count == 8:
        return [Link(a=a, b=b, kind=LinkKind.NVLINK, lanes=n) for (a, b), n in HYBRID_CUBE_MESH.items()]
    return []
