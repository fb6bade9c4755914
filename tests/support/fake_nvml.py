"""A fake `pynvml` for machines this sandbox does not have (NVML needs a driver and a GPU).

It implements the calls `topology.readers.nvml` makes, with the constants and error classes
of nvidia-ml-py 13.x, and reproduces four real machines: an HGX H100 (NVSwitch), a DGX-1
(hybrid cube mesh, GPU peers), a PCIe box (RTX 4090, no P2P) and an HGX H100 with one GPU's
NVLink ports degraded. `advance(seconds)` moves time on: error counters grow at their rates.
It also writes the matching sysfs tree (PCI device paths, NUMA, RDMA NICs).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from topology.gpus import HYBRID_CUBE_MESH

NVML_SUCCESS = 0
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_FEATURE_ENABLED = 1
NVML_NVLINK_MAX_LINKS = 18
NVML_NVLINK_DEVICE_TYPE_GPU = 0
NVML_NVLINK_DEVICE_TYPE_SWITCH = 2
NVML_NVLINK_ERROR_DL_REPLAY = 0
NVML_NVLINK_ERROR_DL_RECOVERY = 1
NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
NVML_NVLINK_ERROR_DL_CRC_DATA = 3
NVML_P2P_CAPS_INDEX_READ = 0
NVML_P2P_STATUS_OK = 0
NVML_P2P_STATUS_GPU_NOT_SUPPORTED = 2
NVML_AFFINITY_SCOPE_NODE = 0
nvmlEventTypeXidCriticalError = 0x8
_MESSAGES = {2: "Invalid Argument", 3: "Not Supported", 10: "Timeout", 12: "NVML Shared Library Not Found"}


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML error {self.value}")


@dataclass
class Port:
    remote_bus: str
    remote_type: int
    active: bool = True
    replay_per_s: float = 0.0


@dataclass
class FakeGpu:
    bus: str
    name: str
    numa: int
    cpus: tuple[int, int]
    ports: list[Port] = field(default_factory=list)
    nvlink_supported: bool = True
    pcie: tuple[int, int, int, int] = (5, 5, 16, 16)
    fabric: tuple[int, bytes, int, int] | None = None  # (state, cluster uuid, clique, health mask)
    memory_bytes: int = 80 * 10**9
    device_id: int | None = None


class _Pci:
    def __init__(self, bus: str, device_id: int | None = None) -> None:
        self.busId = ("00000000:" + bus).encode()  # NVML prints an 8-digit domain
        if device_id is not None:
            self.pciDeviceId = (device_id << 16) | 0x10DE  # device id over NVIDIA's vendor id


class FakeNvml:
    """Module-like: pass as `nvml=` to topology.readers.nvml.discover."""

    NVMLError = NVMLError

    def __init__(self, gpus: list[FakeGpu], ancestors: dict[tuple[int, int], int], p2p_ok: bool = True,
                 xids: list[tuple[int, int]] | None = None, driver: bool = True) -> None:
        self.gpus, self.ancestors, self.p2p_ok, self.driver = gpus, ancestors, p2p_ok, driver
        self.pending_xids = list(xids or [])
        self.elapsed_s = 0.0
        self.initialised = False
        for name, value in globals().items():
            if name.startswith(("NVML_", "nvmlEvent")):
                setattr(self, name, value)

    # time
    def advance(self, seconds: float) -> None:
        self.elapsed_s += seconds

    # lifecycle
    def nvmlInit(self) -> None:
        if not self.driver:
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> str:
        return self.gpus[h].name

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-fake-{h:04d}"

    def nvmlDeviceGetPciInfo(self, h: int) -> _Pci:
        return _Pci(self.gpus[h].bus, self.gpus[h].device_id)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return type("Mem", (), {"total": self.gpus[h].memory_bytes})()

    def nvmlDeviceGetCpuAffinity(self, h: int, size: int) -> list[int]:
        lo, hi = self.gpus[h].cpus
        mask = sum(1 << c for c in range(lo, hi + 1))
        return [(mask >> (64 * w)) & (2**64 - 1) for w in range(max(size, (hi // 64) + 1))]

    def nvmlDeviceGetMemoryAffinity(self, h: int, size: int, scope: int) -> list[int]:
        return [1 << self.gpus[h].numa]

    def nvmlDeviceGetNumaNodeId(self, h: int) -> int:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        return self.ancestors[(min(a, b), max(a, b))]

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, index: int) -> int:
        return NVML_P2P_STATUS_OK if self.p2p_ok else NVML_P2P_STATUS_GPU_NOT_SUPPORTED

    # PCIe
    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return self.gpus[h].pcie[0]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return self.gpus[h].pcie[1]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return self.gpus[h].pcie[2]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return self.gpus[h].pcie[3]

    def nvmlDeviceGetPcieReplayCounter(self, h: int) -> int:
        return 0

    # NVLink
    def _port(self, h: int, link: int) -> Port:
        gpu = self.gpus[h]
        if not gpu.nvlink_supported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if link >= len(gpu.ports):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return gpu.ports[link]

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        return 1 if self._port(h, link).active else 0

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: int, link: int) -> _Pci:
        return _Pci(self._port(h, link).remote_bus)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: int, link: int) -> int:
        return self._port(h, link).remote_type

    def nvmlDeviceGetNvLinkVersion(self, h: int, link: int) -> int:
        self._port(h, link)
        return 6 if "H100" in self.gpus[h].name else 2

    def nvmlDeviceGetNvLinkErrorCounter(self, h: int, link: int, counter: int) -> int:
        port = self._port(h, link)
        return round(port.replay_per_s * self.elapsed_s) if counter == NVML_NVLINK_ERROR_DL_REPLAY else 0

    # fabric
    nvmlGpuFabricInfo_v2 = 0x02000024

    class c_nvmlGpuFabricInfoV_t(ctypes.Structure):  # the layout of pynvml's v2 struct
        _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_char * 16), ("status", ctypes.c_uint),
                    ("cliqueId", ctypes.c_uint32), ("state", ctypes.c_uint8), ("healthMask", ctypes.c_uint32)]

    def nvmlDeviceGetGpuFabricInfoV(self, h: int, info: Any) -> None:
        """As the driver: it takes a pointer (pynvml passes the argument through untouched; a
        struct by value crashes the process) to a struct whose version it checks."""
        if not hasattr(info, "_obj"):
            raise TypeError("nvmlDeviceGetGpuFabricInfoV needs ctypes.byref(info): a struct by value segfaults")
        target = info._obj
        if target.version != self.nvmlGpuFabricInfo_v2:
            raise self.NVMLError(2)  # NVML_ERROR_INVALID_ARGUMENT (version mismatch)
        fabric = self.gpus[h].fabric
        if fabric is None:
            target.state = 0
            return
        state, uuid, clique, health = fabric
        target.state, target.cliqueId, target.healthMask = state, clique, health
        ctypes.memmove(ctypes.addressof(target) + type(target).clusterUuid.offset, bytes(uuid).ljust(16, b"\0"), 16)

    # events
    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlDeviceRegisterEvents(self, h: int, mask: int, es: object) -> None:
        return None

    def nvmlEventSetWait_v2(self, es: object, timeout_ms: int) -> Any:
        if not self.pending_xids:
            self.advance(timeout_ms / 1000.0)
            raise NVMLError(NVML_ERROR_TIMEOUT)
        gpu, xid = self.pending_xids.pop(0)
        return type("Event", (), {"device": gpu, "eventType": nvmlEventTypeXidCriticalError, "eventData": xid})()

    def nvmlEventSetFree(self, es: object) -> None:
        return None


H100_BUS = ["18:00.0", "2a:00.0", "3a:00.0", "5d:00.0", "9a:00.0", "ab:00.0", "ba:00.0", "db:00.0"]
SWITCH_BUS = ["c1:00.0", "c2:00.0", "c3:00.0", "c4:00.0"]
SOCKET_CPUS = [(0, 55), (56, 111)]


def _pcie_ancestors(numa: list[int], same_socket: int) -> dict[tuple[int, int], int]:
    n = len(numa)
    return {(a, b): (same_socket if numa[a] == numa[b] else 50) for a in range(n) for b in range(a + 1, n)}


def hgx_h100(degraded_gpu: int | None = None, replay_per_min: float = 0.0, active_ports: int = 18) -> FakeNvml:
    """`replay_per_min` is the degraded GPU's total over its active ports."""
    gpus = []
    for i, bus in enumerate(H100_BUS):
        ports = []
        for p in range(18):
            degraded = i == degraded_gpu
            ports.append(Port(SWITCH_BUS[p % 4], NVML_NVLINK_DEVICE_TYPE_SWITCH,
                              active=not degraded or p < active_ports,
                              replay_per_s=replay_per_min / 60.0 / active_ports if degraded else 0.0))
        gpus.append(FakeGpu(bus=bus, name="NVIDIA H100 80GB HBM3", numa=i // 4, cpus=SOCKET_CPUS[i // 4],
                            ports=ports))
    return FakeNvml(gpus, _pcie_ancestors([g.numa for g in gpus], 40))


def dgx1() -> FakeNvml:
    bus = ["06:00.0", "07:00.0", "0a:00.0", "0b:00.0", "85:00.0", "86:00.0", "89:00.0", "8a:00.0"]
    gpus = [FakeGpu(bus=b, name="Tesla V100-SXM2-16GB", numa=i // 4, cpus=[(0, 11), (12, 23)][i // 4],
                    pcie=(3, 3, 16, 16), memory_bytes=16 * 10**9) for i, b in enumerate(bus)]
    for (a, b), lanes in HYBRID_CUBE_MESH.items():
        for _ in range(lanes):
            gpus[a].ports.append(Port(bus[b], NVML_NVLINK_DEVICE_TYPE_GPU))
            gpus[b].ports.append(Port(bus[a], NVML_NVLINK_DEVICE_TYPE_GPU))
    return FakeNvml(gpus, _pcie_ancestors([g.numa for g in gpus], 10))


def pcie_box() -> FakeNvml:
    bus = ["01:00.0", "21:00.0", "41:00.0", "61:00.0", "81:00.0", "a1:00.0", "c1:00.0", "e1:00.0"]
    gpus = [FakeGpu(bus=b, name="NVIDIA GeForce RTX 4090", numa=i // 4, cpus=[(0, 63), (64, 127)][i // 4],
                    nvlink_supported=False, pcie=(4, 4, 16, 16), memory_bytes=24 * 10**9)
            for i, b in enumerate(bus)]
    return FakeNvml(gpus, _pcie_ancestors([g.numa for g in gpus], 40), p2p_ok=False)


def gb200_tray(tray: int, clique: int = 7) -> FakeNvml:
    uuid = bytes(range(16))
    cpus = [(0, 71), (72, 143)]
    gpus = [FakeGpu(bus=f"{0x10 * (i + 1):02x}:00.0", name="NVIDIA GB200", numa=i // 2, cpus=cpus[i // 2],
                    ports=[Port(f"f{p % 9}:00.0", NVML_NVLINK_DEVICE_TYPE_SWITCH) for p in range(18)],
                    fabric=(3, uuid, clique, 0)) for i in range(4)]
    return FakeNvml(gpus, _pcie_ancestors([g.numa for g in gpus], 40))


def write_sysfs(root: Path, nvml: FakeNvml, nics: dict[str, tuple[str, int, str, str]]) -> Path:
    """PCI tree: each GPU under its own switch port below a per-socket host bridge; `nics` maps
    name -> (bus id, index of the GPU whose switch it shares or -1 for the host bridge, rate,
    link layer)."""
    def device(busid: str, numa: int, chain: list[str]) -> None:
        real = root / "devices" / f"pci0000:{numa:02x}" / Path(*chain) / busid
        real.mkdir(parents=True, exist_ok=True)
        (real / "numa_node").write_text(f"{numa}\n")
        link = root / "bus/pci/devices" / busid
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            os.symlink(real, link)

    for i, gpu in enumerate(nvml.gpus):
        device("0000:" + gpu.bus, gpu.numa, [f"0000:{gpu.numa:02x}:01.0", f"0000:{gpu.numa:02x}:{i + 2:02x}.0"])
    for name, (busid, near, rate, layer) in nics.items():
        numa = nvml.gpus[near].numa if near >= 0 else 0
        port = f"0000:{numa:02x}:{near + 2:02x}.0"
        chain = [f"0000:{numa:02x}:01.0", port] if near >= 0 else [f"0000:{numa:02x}:09.0"]
        device(busid, numa, chain)
        ib = root / "class/infiniband" / name
        (ib / "ports/1").mkdir(parents=True, exist_ok=True)
        os.symlink(root / "bus/pci/devices" / busid, ib / "device")
        (ib / "ports/1/rate").write_text(rate + "\n")
        (ib / "ports/1/link_layer").write_text(layer + "\n")
    return root
