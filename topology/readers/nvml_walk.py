"""The per-GPU NVML probe: identity, affinity, PCIe state, the NVLink port walk, fabric info.

Every optional call treats NVMLError (NotSupported, InvalidArgument, ...) as "unknown".
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from topology.readers.nccl import normalise_busid
from topology.readers.sysfs import pci_numa_node

NVLINK_VERSION_TO_GENERATION = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5, 8: 6}
"""NVML_NVLINK_VERSION_1_0=1, 2_0=2, 2_2=3, 3_0=4, 3_1=5, 4_0=6, 5_0=7, 6_0=8."""
FABRIC_STATE_COMPLETED = 3
LOAD_UTILISATION_PERCENT = 50


@dataclass(slots=True)
class GpuProbe:
    index: int
    handle: Any
    name: str | None = None
    pci_device: str | None = None
    """PCI device id, e.g. 0x2335 (names the catalogue model where NVML's name is vague)."""
    uuid: str | None = None
    bus_id: str = ""
    memory_gb: float | None = None
    cpu_words: list[int] = field(default_factory=list)
    numa_node: int | None = None
    gpu_numa_node: int | None = None
    pcie_generation: int | None = None
    pcie_generation_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    under_load: bool = False
    nvlink_generation: int | None = None
    ports: list[tuple[int, str, int]] = field(default_factory=list)
    """Active NVLink ports: (link number, remote bus id, remote device type)."""
    inactive_ports: int = 0
    peer_lanes: dict[str, int] = field(default_factory=dict)
    switches: set[str] = field(default_factory=set)
    switch_ports: int = 0
    fabric_clique: str | None = None
    fabric_health_mask: int = 0


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _try(nv: Any, fn: str, *args: Any) -> Any:
    call = getattr(nv, fn, None)
    if call is None:
        return None
    try:
        return call(*args)
    except nv.NVMLError:
        return None


def _first_bit(words: Any) -> int | None:
    for w, word in enumerate(words or ()):
        value = int(word)
        if value:
            return w * 64 + (value & -value).bit_length() - 1
    return None


def _walk_nvlink(nv: Any, p: GpuProbe) -> None:
    for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            state = nv.nvmlDeviceGetNvLinkState(p.handle, link)
        except nv.NVMLError:
            continue  # this link index does not exist on this GPU
        if state != nv.NVML_FEATURE_ENABLED:
            p.inactive_ports += 1
            continue
        remote = _try(nv, "nvmlDeviceGetNvLinkRemotePciInfo", p.handle, link)
        rtype = _try(nv, "nvmlDeviceGetNvLinkRemoteDeviceType", p.handle, link)
        version = _try(nv, "nvmlDeviceGetNvLinkVersion", p.handle, link)
        if version is not None:
            p.nvlink_generation = NVLINK_VERSION_TO_GENERATION.get(int(version), p.nvlink_generation)
        rbus = normalise_busid(_text(remote.busId)) if remote is not None else ""
        rtype = int(rtype) if rtype is not None else -1
        p.ports.append((link, rbus, rtype))
        if rtype == nv.NVML_NVLINK_DEVICE_TYPE_SWITCH:
            p.switch_ports += 1
            if rbus:
                p.switches.add(rbus)
        elif rtype in (nv.NVML_NVLINK_DEVICE_TYPE_GPU, -1) and rbus:
            p.peer_lanes[rbus] = p.peer_lanes.get(rbus, 0) + 1


def _uuid_hex(info: Any) -> str:
    """The 16 bytes of clusterUuid (a c_char array reads only up to its first zero byte)."""
    field = getattr(type(info), "clusterUuid", None)
    if field is not None and hasattr(field, "offset"):
        return ctypes.string_at(ctypes.addressof(info) + field.offset, 16).hex()
    value = info.clusterUuid
    return value if isinstance(value, str) else bytes(value).hex()


def _fabric(nv: Any, p: GpuProbe) -> None:
    factory = getattr(nv, "c_nvmlGpuFabricInfoV_t", None)
    getter = getattr(nv, "nvmlDeviceGetGpuFabricInfoV", None)
    if factory is None or getter is None:
        return
    info = factory()
    if hasattr(nv, "nvmlGpuFabricInfo_v2"):
        info.version = nv.nvmlGpuFabricInfo_v2  # a versioned struct: the driver checks this field
    try:
        getter(p.handle, ctypes.byref(info))  # pynvml passes it through as is: C wants a pointer
    except nv.NVMLError:
        return
    if int(info.state) != FABRIC_STATE_COMPLETED:
        return
    uuid = _uuid_hex(info)
    if any(c != "0" for c in uuid):
        p.fabric_clique = f"{uuid}/{int(info.cliqueId)}"
    p.fabric_health_mask = int(getattr(info, "healthMask", 0) or 0)


def probe_gpu(nv: Any, index: int, sysfs_root: Path) -> GpuProbe:
    h = nv.nvmlDeviceGetHandleByIndex(index)
    p = GpuProbe(index=index, handle=h)
    name = _try(nv, "nvmlDeviceGetName", h)
    p.name = _text(name) if name is not None else None
    uuid = _try(nv, "nvmlDeviceGetUUID", h)
    p.uuid = _text(uuid) if uuid is not None else None
    pci = nv.nvmlDeviceGetPciInfo(h)
    p.bus_id = normalise_busid(_text(pci.busId))
    device = getattr(pci, "pciDeviceId", None)  # 0xDDDDVVVV: device id over NVIDIA's vendor id
    p.pci_device = f"0x{(int(device) >> 16) & 0xFFFF:04x}" if device else None
    mem = _try(nv, "nvmlDeviceGetMemoryInfo", h)
    p.memory_gb = round(int(mem.total) / 1e9, 1) if mem is not None else None
    words = _try(nv, "nvmlDeviceGetCpuAffinity", h, max(1, ((os.cpu_count() or 64) + 63) // 64))
    p.cpu_words = [int(w) for w in words] if words is not None else []
    node_words = _try(nv, "nvmlDeviceGetMemoryAffinity", h, 1, getattr(nv, "NVML_AFFINITY_SCOPE_NODE", 0))
    p.numa_node = _first_bit(node_words)
    if p.numa_node is None:
        p.numa_node = pci_numa_node(sysfs_root, p.bus_id)
    gpu_numa = _try(nv, "nvmlDeviceGetNumaNodeId", h)
    p.gpu_numa_node = int(gpu_numa) if gpu_numa is not None and int(gpu_numa) >= 0 else None
    p.pcie_generation = _try(nv, "nvmlDeviceGetCurrPcieLinkGeneration", h)
    p.pcie_generation_max = _try(nv, "nvmlDeviceGetMaxPcieLinkGeneration", h)
    p.pcie_width = _try(nv, "nvmlDeviceGetCurrPcieLinkWidth", h)
    p.pcie_width_max = _try(nv, "nvmlDeviceGetMaxPcieLinkWidth", h)
    util = _try(nv, "nvmlDeviceGetUtilizationRates", h)
    p.under_load = util is not None and int(util.gpu) >= LOAD_UTILISATION_PERCENT
    _walk_nvlink(nv, p)
    _fabric(nv, p)
    return p


def read_error_counters(nv: Any, probes: list[GpuProbe]) -> dict[tuple[int, int], dict[str, int]]:
    """Cumulative counters keyed (gpu, peer gpu) for peer ports, (gpu, -1) for switch ports,
    (gpu, -2) for the PCIe replay counter."""
    by_bus = {p.bus_id: p.index for p in probes}
    out: dict[tuple[int, int], dict[str, int]] = {}
    for p in probes:
        for link, rbus, rtype in p.ports:
            peer = by_bus.get(rbus)
            key = (p.index, peer) if peer is not None and rtype != nv.NVML_NVLINK_DEVICE_TYPE_SWITCH else (p.index, -1)
            acc = out.setdefault(key, {"replay": 0, "recovery": 0, "crc": 0})
            counts = [_try(nv, "nvmlDeviceGetNvLinkErrorCounter", p.handle, link, c) or 0 for c in (
                nv.NVML_NVLINK_ERROR_DL_REPLAY, nv.NVML_NVLINK_ERROR_DL_RECOVERY,
                nv.NVML_NVLINK_ERROR_DL_CRC_FLIT, nv.NVML_NVLINK_ERROR_DL_CRC_DATA)]
            acc["replay"] += int(counts[0])
            acc["recovery"] += int(counts[1])
            acc["crc"] += int(counts[2]) + int(counts[3])
        replay = _try(nv, "nvmlDeviceGetPcieReplayCounter", p.handle)
        out[(p.index, -2)] = {"pcie_replay": int(replay or 0)}
    return out
