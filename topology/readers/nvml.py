"""Live discovery through NVML (`pynvml`, from the nvidia-ml-py package) plus sysfs for NICs.

Per GPU: name, UUID, PCI bus id, memory, CPU affinity and NUMA node, PCIe generation and
width, the NVLink walk (state, remote device and its type, version, error counters per
port), fabric info (clique id and health mask for multi-node NVLink domains). Per pair: the
NVLink bond (peer ports counted, or a shared NVSwitch), otherwise the PCIe common ancestor,
and whether P2P works at all (consumer cards often say no: their data then stages through
host memory). NICs come from /sys/class/infiniband (RDMA devices, IB and RoCE) with their PCI
distance to each GPU from the sysfs device tree.

`nvml` and `sysfs_root` are injected so tests run a fake NVML on a fake sysfs; a real call
without a driver fails with one `DiscoveryError` line.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

from topology.errors import DiscoveryError
from topology.gpus import by_pci_id, gpu_facts
from topology.health import GpuCounters, LinkCounters, apply_node_health, per_minute
from topology.kinds import DEFAULTS, LinkKind, default_bandwidth_gb_s
from topology.model import Gpu, Link, Nic, Node
from topology.readers.build import NicLevels, nics_from_levels
from topology.readers.cpus import words_to_cpu_list
from topology.readers.nccl import normalise_busid
from topology.readers.nvml_walk import GpuProbe, probe_gpu, read_error_counters
from topology.readers.sysfs import pci_level, rdma_nics

ANCESTOR_KIND = {0: LinkKind.PIX, 10: LinkKind.PIX, 20: LinkKind.PXB, 30: LinkKind.PHB, 40: LinkKind.NODE,
                 50: LinkKind.SYS}


def _import_nvml() -> ModuleType:
    try:
        import pynvml
    except ImportError:
        raise DiscoveryError("NVML bindings missing: install the nvidia-ml-py package") from None
    module: ModuleType = pynvml
    return module


def _pair_link(nv: Any, probes: list[GpuProbe], a: int, b: int) -> Link:
    pa, pb = probes[a], probes[b]
    gen = pa.nvlink_generation or pb.nvlink_generation
    direct = pa.peer_lanes.get(pb.bus_id, 0) or pb.peer_lanes.get(pa.bus_id, 0)
    if direct:
        return Link(a=a, b=b, kind=LinkKind.NVLINK, lanes=direct,
                    bandwidth_gb_s=default_bandwidth_gb_s(LinkKind.NVLINK, direct, gen))
    if pa.switch_ports and pb.switch_ports and (pa.switches & pb.switches or not (pa.switches or pb.switches)):
        # Nominal bond width; inactive ports show up in the link's health, not here.
        lanes = min(pa.switch_ports + pa.inactive_ports, pb.switch_ports + pb.inactive_ports)
        return Link(a=a, b=b, kind=LinkKind.NVSWITCH, lanes=lanes,
                    bandwidth_gb_s=default_bandwidth_gb_s(LinkKind.NVSWITCH, lanes, gen))
    try:
        level = int(nv.nvmlDeviceGetTopologyCommonAncestor(pa.handle, pb.handle))
    except nv.NVMLError:
        level = 50
    kind = ANCESTOR_KIND.get(level, LinkKind.SYS)
    bandwidth = default_bandwidth_gb_s(kind, pcie_generation=pa.pcie_generation_max)
    try:
        p2p_ok = nv.nvmlDeviceGetP2PStatus(pa.handle, pb.handle, nv.NVML_P2P_CAPS_INDEX_READ) == nv.NVML_P2P_STATUS_OK
    except nv.NVMLError:
        p2p_ok = True
    if not p2p_ok:  # no peer-to-peer: copies stage through host memory
        bandwidth = min(bandwidth, DEFAULTS[LinkKind.SYS].bandwidth_gb_s)
    return Link(a=a, b=b, kind=kind, bandwidth_gb_s=bandwidth)


def _link_counters(probes: list[GpuProbe], link: Link, rates: dict[tuple[int, int], dict[str, float]]) -> LinkCounters:
    pa, pb = probes[link.a], probes[link.b]
    if link.kind is LinkKind.NVSWITCH:
        total = min(pa.switch_ports + pa.inactive_ports, pb.switch_ports + pb.inactive_ports)
        active = min(pa.switch_ports, pb.switch_ports)
        keys = [(link.a, -1), (link.b, -1)]
    else:
        total, active = None, None
        keys = [(link.a, link.b), (link.b, link.a)]
    merged = {"replay": 0.0, "recovery": 0.0, "crc": 0.0}
    for key in keys:
        for name, value in rates.get(key, {}).items():
            merged[name] = max(merged[name], value)
    return LinkCounters(lanes_total=total, lanes_active=active, replay_per_min=merged["replay"],
                        recovery_per_min=merged["recovery"], crc_per_min=merged["crc"])


def _rates(before: dict[tuple[int, int], dict[str, int]], after: dict[tuple[int, int], dict[str, int]],
           seconds: float) -> dict[tuple[int, int], dict[str, float]]:
    return {key: {name: per_minute(before.get(key, {}).get(name, 0), value, seconds) for name, value in cur.items()}
            for key, cur in after.items()}


def _collect_xids(
    nv: Any, probes: list[GpuProbe], wait_s: float, sleep: Callable[[float], None]
) -> dict[int, list[int]]:
    """Wait up to `wait_s` for XID events (this is also the pause between counter samples)."""
    xids: dict[int, list[int]] = {}
    try:
        es = nv.nvmlEventSetCreate()
        for p in probes:
            nv.nvmlDeviceRegisterEvents(p.handle, nv.nvmlEventTypeXidCriticalError, es)
    except (nv.NVMLError, AttributeError):
        sleep(wait_s)
        return xids
    by_uuid = {p.uuid: p.index for p in probes}
    deadline = time.monotonic() + wait_s
    try:
        while (left_ms := int((deadline - time.monotonic()) * 1000)) > 0:
            try:
                event = nv.nvmlEventSetWait_v2(es, left_ms)
            except nv.NVMLError:
                break  # timeout: no more events
            uuid = _text(nv.nvmlDeviceGetUUID(event.device))
            if uuid in by_uuid:
                xids.setdefault(by_uuid[uuid], []).append(int(event.eventData))
    finally:
        with contextlib.suppress(nv.NVMLError, AttributeError):
            nv.nvmlEventSetFree(es)
    return xids


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nics(probes: list[GpuProbe], sysfs_root: Path) -> list[Nic]:
    found = rdma_nics(sysfs_root)
    levels: NicLevels = {
        n.name: {p.index: pci_level(sysfs_root, p.bus_id, n.pci_bus_id) for p in probes} for n in found
    }
    by_name = {n.name: n for n in found}
    return [replace(by_name[n.name], nearest_gpus=n.nearest_gpus, level=n.level, gpu_levels=n.gpu_levels)
            for n in nics_from_levels(levels)]


def discover(
    node_name: str = "node0",
    nvml: Any = None,
    sysfs_root: Path = Path("/sys"),
    sample_s: float = 0.0,
    sleep: Callable[[float], None] = time.sleep,
) -> Node:
    """Discover this machine. `sample_s` > 0 reads error counters twice to get rates."""
    nv = nvml or _import_nvml()
    try:
        nv.nvmlInit()
    except nv.NVMLError as err:
        raise DiscoveryError(
            f"NVML unavailable on this machine ({err}): no NVIDIA driver here; "
            "read a capture (`nvidia-smi topo -m`) or a cluster spec instead"
        ) from None
    try:
        count = int(nv.nvmlDeviceGetCount())
        probes = [probe_gpu(nv, i, sysfs_root) for i in range(count)]
        before = read_error_counters(nv, probes)
        xids: dict[int, list[int]] = {}
        if sample_s > 0:
            xids = _collect_xids(nv, probes, sample_s, sleep)
        rates = _rates(before, read_error_counters(nv, probes), sample_s) if sample_s > 0 else {}
        links = [_pair_link(nv, probes, a, b) for a in range(count) for b in range(a + 1, count)]
    except nv.NVMLError as err:
        raise DiscoveryError(f"NVML call failed during discovery: {err}") from None
    finally:
        nv.nvmlShutdown()
    gpus = tuple(
        Gpu(index=p.index, model=_model(p), pci_bus_id=normalise_busid(p.bus_id), uuid=p.uuid, numa_node=p.numa_node,
            cpu_affinity=words_to_cpu_list(p.cpu_words) if p.cpu_words else None, gpu_numa_node=p.gpu_numa_node,
            memory_gb=p.memory_gb, nvlink_generation=p.nvlink_generation, fabric_clique=p.fabric_clique)
        for p in probes
    )
    node = Node(name=node_name, gpus=gpus, links=tuple(links), nics=tuple(_nics(probes, sysfs_root)),
                source_format="nvml", machine=probes[0].name if probes else None)
    link_counters = {(k.a, k.b): _link_counters(probes, k, rates) for k in node.links if k.kind.is_gpu_fabric}
    gpu_counters = {
        p.index: GpuCounters(pcie_generation=p.pcie_generation, pcie_generation_max=p.pcie_generation_max,
                             pcie_width=p.pcie_width, pcie_width_max=p.pcie_width_max,
                             pcie_replay_per_min=rates.get((p.index, -2), {}).get("pcie_replay", 0.0),
                             under_load=p.under_load, xids=tuple(xids.get(p.index, ())),
                             fabric_health_mask=p.fabric_health_mask)
        for p in probes
    }
    return apply_node_health(node, link_counters, gpu_counters)


def _model(p: GpuProbe) -> str | None:
    """The catalogue name when the PCI device id is known ('NVIDIA H200' -> h200-sxm) or NVML's
    name reads as one (`gpu_facts`: a part whose id the catalogue lacks, 'NVIDIA H100 80GB HBM3'
    under a new id), else NVML's own name."""
    facts = by_pci_id(p.pci_device) if p.pci_device else None
    if facts is None and p.name:
        try:
            facts = gpu_facts(p.name)
        except ValueError:
            return p.name
    return facts.name if facts is not None else p.name
