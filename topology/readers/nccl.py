"""Reader for NCCL topology XML (the files operators set as NCCL_TOPO_FILE, or NCCL's dumps).

What the file says is used: CPUs (NUMA id, affinity mask), the PCI tree (bridges, GPUs by
class 0x03xxxx or a <gpu> child, NICs by class 0x02xxxx or a <nic> child), <net> speeds and
<nvlink> elements (to a GPU: a direct bond; to an NVSwitch: GPUs sharing switches form one
all-to-all fabric). PCIe levels follow the tree: same bridge PIX, deeper common bridge PXB,
meeting at the CPU PHB, different CPUs SYS.

What it often does not say is taken the way NCCL takes it, from the machine: static files
usually omit NVLink (NCCL asks NVML at run time). Then the GPU model decides, from its PCI
device id when the file has one, or from the `gpu` hint: an 8-GPU SXM baseboard is an
NVSwitch fabric (A100/H100/B200) or a hybrid cube mesh (V100). Entries with no class at all
are classified from sysfs when their bus id exists on this machine, or from explicit hints,
or, for the static files AWS ships with its NCCL plugin (aws-ofi-nccl), from what AWS publishes
about that platform (`PLATFORMS`, named by the file's own header comment).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from topology.errors import ParseError
from topology.gpus import GpuFacts, baseboard_links, by_pci_id, gpu_facts
from topology.kinds import LinkKind
from topology.model import Gpu, Link, Nic, Node
from topology.readers.build import NicLevels, nics_from_levels
from topology.readers.cpus import mask_to_cpu_list

MAX_PCI_DEPTH = 32
"""Real PCIe trees are a handful of switches deep."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NcclHints:
    gpu: str | None = None
    """GPU model (topology.gpus catalogue) when the file does not identify it."""
    pci_classes: Mapping[str, str] = field(default_factory=dict)
    """Bus id -> 'gpu' | 'nic' | 'bridge' for entries the file leaves without a class; the key
    '*' gives the role of every such entry not named otherwise (after sysfs)."""
    sysfs_root: Path | None = Path("/sys")


@dataclass(frozen=True, slots=True, kw_only=True)
class Platform:
    """What an instance type's static NCCL file leaves out: the GPU model and the role of each
    bus id it lists without a class ('*': every other such id)."""

    gpu: str
    pci_classes: Mapping[str, str]
    why: str


PLATFORMS: dict[str, Platform] = {
    # aws-ofi-nccl topology/g5.48xl-topo.xml: nine bus ids, no classes. AWS: 8x A10G and one
    # EFA NIC, four GPUs a socket; the eight consecutive ids 00:16.0-00:1d.0 (four under each
    # CPU) are the GPUs, so the ninth, 00:15.0 under CPU 1, is the EFA.
    "g5.48xlarge": Platform(gpu="a10g", pci_classes={"0000:00:15.0": "nic", "*": "gpu"},
                            why="8x A10G and one EFA NIC (0000:00:15.0)"),
}
_PLATFORM_HEADER = re.compile(r"Static pre-configured topology for `([\w.-]+)` platform type")


def platform_of(text: str) -> str | None:
    """The instance type an aws-ofi-nccl static file says it is for, when it is in PLATFORMS."""
    found = _PLATFORM_HEADER.search(text)
    return found.group(1) if found and found.group(1) in PLATFORMS else None


@dataclass(slots=True)
class _Dev:
    busid: str
    numa: int | None
    cpus: str | None
    cpu_key: int
    path: tuple[str, ...]
    device_id: str | None = None
    dev: int | None = None
    nvlinks: list[tuple[str, int, str]] = field(default_factory=list)
    nets: list[tuple[str, float | None]] = field(default_factory=list)
    link_layer: str | None = None


def normalise_busid(busid: str) -> str:
    """'00000000:18:00.0' (NVML) or '0000:18:00.0' -> '0000:18:00.0'."""
    busid = busid.strip().lower()
    dom, _, rest = busid.partition(":")
    return f"{dom[-4:].rjust(4, '0')}:{rest}" if rest else busid


def _sysfs_class(root: Path | None, busid: str) -> str | None:
    if root is None:
        return None
    try:
        return (root / "bus/pci/devices" / busid / "class").read_text().strip()
    except OSError:
        return None


def _role(cls: str | None) -> str | None:
    if not cls:
        return None
    c = cls.lower().removeprefix("0x")
    if c.startswith("03"):
        return "gpu"
    if c.startswith("02"):
        return "nic"
    if c.startswith("06"):
        return "bridge"
    return "other"


class _Walker:
    def __init__(self, hints: NcclHints, platform: Platform | None = None) -> None:
        self.hints = hints
        self.platform = platform
        self.gpus: list[_Dev] = []
        self.nics: list[_Dev] = []
        self.unclassified: list[str] = []
        self.from_platform: list[str] = []

    def cpu(self, el: ET.Element, key: int) -> None:
        numa_text = el.get("numaid")
        numa = int(numa_text) if numa_text and numa_text.lstrip("-").isdigit() else None
        affinity = el.get("affinity")
        try:
            cpus = mask_to_cpu_list(affinity) if affinity else None
        except ValueError as err:
            raise ParseError(str(err)) from None
        for child in el:
            if child.tag == "pci":
                self.pci(child, numa if numa is None or numa >= 0 else None, cpus, key, ())
            elif child.tag == "nic":
                self.nic_element(child, _Dev(busid=f"cpu{key}-nic", numa=numa, cpus=cpus, cpu_key=key, path=()))

    def nic_element(self, nic: ET.Element, dev: _Dev) -> None:
        for net in nic.iter("net"):
            speed = net.get("speed")
            gbit = float(speed) / 1000.0 if speed and speed.replace(".", "", 1).isdigit() else None
            dev.nets.append((net.get("name") or dev.busid, gbit))
        self.nics.append(dev)

    def pci(self, el: ET.Element, numa: int | None, cpus: str | None, key: int, path: tuple[str, ...]) -> None:
        if len(path) > MAX_PCI_DEPTH:
            raise ParseError(f"PCI tree deeper than {MAX_PCI_DEPTH} levels: not a machine's topology")
        busid = normalise_busid(el.get("busid") or "")
        if not busid:
            raise ParseError("a <pci> element has no busid")
        children = [c for c in el if c.tag == "pci"]
        gpu_el, nic_el = el.find("gpu"), el.find("nic")
        role = _role(el.get("class"))
        if gpu_el is not None:
            role = "gpu"
        elif nic_el is not None:
            role = "nic"
        elif role is None and children:
            role = "bridge"
        elif role is None:
            role = (self.hints.pci_classes.get(busid) or _role(_sysfs_class(self.hints.sysfs_root, busid))
                    or self.hints.pci_classes.get("*"))
            if role is None and self.platform is not None:
                role = self.platform.pci_classes.get(busid) or self.platform.pci_classes.get("*")
                self.from_platform += [busid] if role else []
        dev = _Dev(busid=busid, numa=numa, cpus=cpus, cpu_key=key, path=path, device_id=el.get("device"))
        if role == "gpu":
            if gpu_el is not None:
                dev_attr = gpu_el.get("dev")
                dev.dev = int(dev_attr) if dev_attr and dev_attr.isdigit() else None
                for nv in gpu_el.iter("nvlink"):
                    count = nv.get("count") or "1"
                    dev.nvlinks.append((normalise_busid(nv.get("target") or ""), int(count) if count.isdigit() else 1,
                                        (nv.get("tclass") or "").lower()))
            self.gpus.append(dev)
        elif role == "nic":
            cls = (el.get("class") or "").lower()
            dev.link_layer = ("efa" if (el.get("vendor") or "").lower() == "0x1d0f"
                              else "infiniband" if cls.startswith("0x0207") else
                              "ethernet" if cls.startswith("0x02") else None)
            if nic_el is not None:
                self.nic_element(nic_el, dev)
            else:
                dev.nets.append((busid, None))
                self.nics.append(dev)
        elif role is None:
            self.unclassified.append(busid)
        for child in children:
            self.pci(child, numa, cpus, key, (*path, busid))


def _level(a: _Dev, b: _Dev) -> LinkKind:
    if a.cpu_key != b.cpu_key:
        return LinkKind.SYS
    common = 0
    for x, y in zip(a.path, b.path, strict=False):
        if x != y:
            break
        common += 1
    if common == 0:
        return LinkKind.PHB
    return LinkKind.PIX if len(a.path) == len(b.path) == common else LinkKind.PXB


def _nvlink_links(gpus: list[_Dev]) -> list[Link]:
    index = {g.busid: i for i, g in enumerate(gpus)}
    direct: dict[tuple[int, int], int] = {}
    switches: dict[int, set[str]] = {}
    switch_lanes: dict[int, int] = {}
    for i, g in enumerate(gpus):
        for target, count, tclass in g.nvlinks:
            if target in index and target != g.busid:
                pair = (min(i, index[target]), max(i, index[target]))
                direct[pair] = max(direct.get(pair, 0), count)
            elif tclass.startswith("0x0680") or tclass == "":
                switches.setdefault(i, set()).add(target)
                switch_lanes[i] = switch_lanes.get(i, 0) + count
    links = [Link(a=a, b=b, kind=LinkKind.NVLINK, lanes=n) for (a, b), n in direct.items()]
    for a, switches_a in switches.items():
        for b, switches_b in switches.items():
            if a < b and (a, b) not in direct and switches_a & switches_b:
                links.append(Link(a=a, b=b, kind=LinkKind.NVSWITCH, lanes=min(switch_lanes[a], switch_lanes[b])))
    return links


def _facts(gpus: list[_Dev], hints: NcclHints, platform: Platform | None) -> GpuFacts | None:
    if hints.gpu:
        return gpu_facts(hints.gpu)
    ids = {g.device_id for g in gpus if g.device_id}
    if len(ids) == 1:
        return by_pci_id(ids.pop())
    return gpu_facts(platform.gpu) if platform is not None and not ids and gpus else None


def parse_nccl(text: str, node_name: str = "node0", hints: NcclHints | None = None) -> Node:
    hints = hints or NcclHints()
    if re.search(r"<!(DOCTYPE|ENTITY)", text):
        raise ParseError("NCCL topology XML must not contain DOCTYPE or ENTITY declarations")
    try:
        root = ET.fromstring(text)
    except ET.ParseError as err:
        raise ParseError(f"malformed XML ({err})") from None
    if root.tag != "system":
        raise ParseError(f"not an NCCL topology: root element is <{root.tag}>, expected <system>")
    platform_name = platform_of(text)
    platform = PLATFORMS[platform_name] if platform_name else None
    walker = _Walker(hints, platform)
    cpus = [c for c in root.iter("cpu")]
    if not cpus:
        raise ParseError("NCCL topology has no <cpu> element")
    for key, cpu in enumerate(cpus):
        walker.cpu(cpu, key)
    gpus = walker.gpus
    if all(g.dev is not None for g in gpus):
        gpus.sort(key=lambda g: g.dev or 0)
    else:
        gpus.sort(key=lambda g: g.busid)  # NVML enumerates in PCI bus order
    facts = _facts(gpus, hints, platform)
    links = {(k.a, k.b): k for k in _nvlink_links(gpus)}
    if not links and facts is not None:
        links = {(k.a, k.b): k for k in baseboard_links(facts, len(gpus))}
    out_links: list[Link] = []
    for a in range(len(gpus)):
        for b in range(a + 1, len(gpus)):
            link = links.get((a, b)) or Link(a=a, b=b, kind=_level(gpus[a], gpus[b]))
            if facts is not None:
                link = Link(a=a, b=b, kind=link.kind, lanes=link.lanes,
                            bandwidth_gb_s=facts.link_gb_s(link.kind, link.lanes))
            out_links.append(link)
    levels: NicLevels = {}
    meta: dict[str, tuple[str, float | None, int | None, str | None]] = {}
    for nic in walker.nics:
        for name, gbit in nic.nets:
            levels[name] = {i: _level(g, nic) for i, g in enumerate(gpus)}
            meta[name] = (nic.busid, gbit, nic.numa, nic.link_layer)
    nics = [
        Nic(name=n.name, nearest_gpus=n.nearest_gpus, level=n.level, pci_bus_id=meta[n.name][0],
            speed_gbit_s=meta[n.name][1], numa_node=meta[n.name][2], link_layer=meta[n.name][3],
            gpu_levels=n.gpu_levels)
        for n in nics_from_levels(levels)
    ]
    model = facts.name if facts else None
    node_gpus = tuple(
        Gpu(index=i, pci_bus_id=g.busid, numa_node=g.numa, cpu_affinity=g.cpus, model=model,
            nvlink_generation=facts.nvlink_generation if facts else None,
            memory_gb=facts.memory_gb if facts else None)
        for i, g in enumerate(gpus)
    )
    notes: list[str] = []
    if walker.from_platform:
        notes.append(
            f"{len(walker.from_platform)} PCI devices have no class in the file; classified as the {platform_name} "
            f"it says it is for ({platform.why if platform else ''}); --pci-class overrides"
        )
    if walker.unclassified:
        notes.append(
            f"{len(walker.unclassified)} PCI devices have no class in the file and none on this machine "
            f"({', '.join(walker.unclassified)}): NCCL classifies them from sysfs at run time; "
            "read the file on its machine or pass --pci-class BUSID=gpu|nic"
        )
    if len(gpus) > 1 and not links and facts is None:  # one GPU: no pair for NVLink to join
        notes.append("the file has no <nvlink> elements and no GPU model: NVLink unknown, pass --gpu MODEL")
    return Node(name=node_name, gpus=node_gpus, links=tuple(out_links), nics=tuple(nics),
                source_format="nccl-xml", machine=model, notes=tuple(notes))
