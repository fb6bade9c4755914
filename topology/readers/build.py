"""Pieces every reader shares: cells to links, NIC nearest-GPU sets, NVSwitch recognition."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace

from topology.kinds import LinkKind, default_bandwidth_gb_s
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
NVSWITCH_MIN_LANES = 8
"""NVSwitch baseboards show every pair with the GPU's full link count: NV8 (H800/A800),
NV12 (A100), NV18 (H100/H200/B200). Bridges and meshes show fewer lanes per pair."""

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


def _components(gpus: Iterable[int], links: list[Link]) -> list[set[int]]:
    parent = {g: g for g in gpus}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for link in links:
        if link.kind.is_gpu_fabric:
            parent[find(link.a)] = find(link.b)
    comps: dict[int, set[int]] = {}
    for g in parent:
        comps.setdefault(find(g), set()).add(g)
    return list(comps.values())


def upgrade_nvswitch(links: list[Link]) -> list[Link]:
    """Mark NVLink components that are NVSwitch fabrics (full mesh, equal wide bonds, >= 4 GPUs)."""
    gpus = {x for link in links for x in (link.a, link.b)}
    by_pair = {(k.a, k.b): k for k in links}
    switched: set[tuple[int, int]] = set()
    for comp in _components(gpus, links):
        if len(comp) < 4:
            continue
        pairs = [(a, b) for a in sorted(comp) for b in sorted(comp) if a < b]
        found = [by_pair.get(p) for p in pairs]
        lanes = {k.lanes for k in found if k is not None and k.kind is LinkKind.NVLINK}
        if all(k is not None and k.kind is LinkKind.NVLINK for k in found) and len(lanes) == 1:
            (only,) = lanes
            if only is not None and only >= NVSWITCH_MIN_LANES:
                switched.update(pairs)
    return [
        replace(k, kind=LinkKind.NVSWITCH, bandwidth_gb_s=0.0, latency_us=0.0)
        if (k.a, k.b) in switched
        else k
        for k in links
    ]


def with_gpu_facts(node: Node, model: str | None, nvlink_generation: int | None,
                   pcie_generation: int | None, memory_gb: float | None) -> Node:
    """Stamp a GPU model onto a parsed node and rescale link bandwidths to its generations."""
    gpus = tuple(
        replace(g, model=g.model or model, nvlink_generation=g.nvlink_generation or nvlink_generation,
                memory_gb=g.memory_gb or memory_gb)
        for g in node.gpus
    )
    links = tuple(
        replace(
            k,
            bandwidth_gb_s=default_bandwidth_gb_s(k.kind, k.lanes, nvlink_generation, pcie_generation),
        )
        for k in node.links
    )
    return replace(node, gpus=tuple(gpus), links=links, machine=node.machine or model)


def gpu_with_index(gpus: Iterable[Gpu], index: int) -> Gpu:
    for g in gpus:
        if g.index == index:
            return g
    raise KeyError(index)
