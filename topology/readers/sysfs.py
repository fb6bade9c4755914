"""What Linux sysfs says about PCI placement and RDMA NICs (root injectable for tests).

PCI level between two devices from their device-tree paths
(`/sys/devices/pci0000:17/0000:17:00.0/0000:18:00.0/...`): same parent bridge PIX, a deeper
common bridge PXB, meeting at the host bridge PHB, different host bridges of one NUMA node
NODE, different NUMA nodes SYS (the same levels `nvidia-smi topo -m` prints).
"""

from __future__ import annotations

import os
from pathlib import Path

from topology.kinds import LinkKind
from topology.model import Nic


def _device_path(root: Path, busid: str) -> list[str] | None:
    link = root / "bus/pci/devices" / busid
    try:
        real = os.path.realpath(link)
    except OSError:
        return None
    if not os.path.exists(real):
        return None
    parts = Path(real).parts
    for i, part in enumerate(parts):
        if part.startswith("pci") and ":" in part:
            return list(parts[i:])
    return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def pci_numa_node(root: Path, busid: str) -> int | None:
    text = _read(root / "bus/pci/devices" / busid / "numa_node")
    if text is None or not text.lstrip("-").isdigit() or int(text) < 0:
        return None
    return int(text)


def pci_level(root: Path, a: str | None, b: str | None) -> LinkKind:
    if not a or not b:
        return LinkKind.SYS
    na, nb = pci_numa_node(root, a), pci_numa_node(root, b)
    if na is not None and nb is not None and na != nb:
        return LinkKind.SYS
    pa, pb = _device_path(root, a), _device_path(root, b)
    if pa is None or pb is None:
        return LinkKind.SYS
    if pa[0] != pb[0]:
        return LinkKind.NODE if na is not None and na == nb else LinkKind.SYS
    below_a, below_b = pa[1:], pb[1:]
    common = 0
    for x, y in zip(below_a, below_b, strict=False):
        if x != y:
            break
        common += 1
    if common == 0:
        return LinkKind.PHB
    if common == len(below_a) - 1 == len(below_b) - 1:
        return LinkKind.PIX
    return LinkKind.PXB


def _speed_gbit(rate: str | None) -> float | None:
    """'400 Gb/sec (4X NDR)' -> 400.0."""
    if not rate:
        return None
    head = rate.split()[0]
    try:
        return float(head)
    except ValueError:
        return None


def rdma_nics(root: Path) -> list[Nic]:
    base = root / "class/infiniband"
    try:
        names = sorted(p.name for p in base.iterdir())
    except OSError:
        return []
    out = []
    for name in names:
        device = base / name / "device"
        try:
            busid = Path(os.path.realpath(device)).name
        except OSError:
            continue
        layer = (_read(base / name / "ports/1/link_layer") or "").lower()
        out.append(Nic(name=name, pci_bus_id=busid, numa_node=pci_numa_node(root, busid),
                       speed_gbit_s=_speed_gbit(_read(base / name / "ports/1/rate")),
                       link_layer="infiniband" if layer == "infiniband" else "ethernet" if layer else None))
    return out
