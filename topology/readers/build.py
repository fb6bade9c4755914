"""Pieces every reader shares: cells to links, NIC nearest-GPU sets, NVSwitch recognition."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace

from topology.gpus import GpuFacts
from topology.kinds import LinkKind
from topology.model import Gpu, Link, Nic, Node

PCIE_CODES: dict[str, LinkKind] = {
    "SYS": LinkKind.SYS,
    "SOC": LinkKind.SYS,  # drivers before ~384 printed SOC for the socket-level link
    "NODE": LinkKind.NODE,
    "PHB": LinkKind.PHB,
    "PXB": LinkKind.PXB,
    "PIX": LinkKind.PIX,
}
_NV = re.compile(r"^NV(\d+)$")

NicLevels = dict[str, dict[int, LinkKind]]
"""NIC name -> GPU index -> PCIe level between them."""


def link_for_cell(a: int, b: int, cell: str) -> Link:
    m = _NV.match(cell)
    if m:
        lanes = int(m.group(1))
        if lanes <= 0:
            raise ValueError(f"NVLink with {lanes} lanes between GPU{a} and GPU{b}")
        return Link(a=a, b=b, kind=LinkKind.NVLINK, lanes=lanes)
    return Link(a=a, b=b, kind=PCIE_CODES[cell])


def nics_from_levels(levels: NicLevels) -> list[Nic]:
    """Nearest GPUs of each NIC are those at its best level (all GPUs when all are SYS)."""
    out: list[Nic] = []
    for name, per_gpu in levels.items():
        if not per_gpu:
            out.append(Nic(name=name))
            continue
        best = max(per_gpu.values())
        nearest = tuple(sorted(g for g, lvl in per_gpu.items() if lvl == best))
        out.append(Nic(name=name, nearest_gpus=nearest, level=best, gpu_levels=tuple(sorted(per_gpu.items()))))
    return sorted(out, key=lambda n: n.name)


def with_gpu_facts(node: Node, facts: GpuFacts) -> Node:
    """Stamp a GPU model onto a parsed node and rescale link bandwidths to its generations and its
    Infinity Fabric link rate (`GpuFacts.link_gb_s`)."""
    gpus = tuple(
        replace(g, model=g.model or facts.name, nvlink_generation=g.nvlink_generation or facts.nvlink_generation,
                memory_gb=g.memory_gb or facts.memory_gb)
        for g in node.gpus
    )
    links = tuple(replace(k, bandwidth_gb_s=facts.link_gb_s(k.kind, k.lanes)) for k in node.links)
    return replace(node, gpus=tuple(gpus), links=links, machine=node.machine or facts.name)


def gpu_with_index(gpus: Iterable[Gpu], index: int) -> Gpu:
    for g in gpus:
        if g.index == index:
            return g
    raise KeyError(index)
