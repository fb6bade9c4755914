"""NVSwitch fabrics told apart from point-to-point NVLink: a capture shows both as `NV<lanes>`
cells; a full mesh of equal, wide bonds over four or more GPUs is a switch (every reader and a
saved topology's JSON apply the same rule)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from topology.kinds import LinkKind
from topology.model import Link

NVSWITCH_MIN_LANES = 8
"""NVSwitch baseboards show every pair with the GPU's full link count: NV8 (H800/A800),
NV12 (A100), NV18 (H100/H200/B200). Bridges and meshes show fewer lanes per pair."""


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
