"""GPU interconnect facts by model name (data: topology/data/gpus.yaml, with sources)."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
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


_VENDOR_WORDS = frozenset({"nvidia", "amd", "instinct", "tesla", "geforce", "radeon", "hbm", "hbm2", "hbm2e",
                           "hbm3", "hbm3e"})
_MEMORY_WORD = re.compile(r"^(\d+)gb?$")
_FORM_WORD = re.compile(r"^(sxm\d?|pcie|nvl\d*|oam|hgx|dgx|superchip)$")


def part_name(text: str, memory_gb: Mapping[str, float]) -> str:
    """The catalogue's name (a key of `memory_gb`, which maps each to its memory) for a GPU part as
    people and tools write it: any case, vendor words and memory type dropped ("NVIDIA H100 80GB
    HBM3", NVML's and nvidia-smi's name for the SXM5 board; "AMD Instinct MI300X"; "A100-SXM4-80GB"),
    a bare family named for its SXM board part, the catalogue's only one otherwise ("H100" is
    h100-sxm, "H100 NVL" h100-nvl, "GB200 NVL72" gb200). Refused, never guessed: a form factor the
    catalogue does not list for that family ("H100 PCIe"), a memory size more than 10 % from the
    catalogued part's ("A100 40GB" is not the 80 GB a100-sxm4; a size twice the part's or more is
    not its HBM: "GH200 480GB" counts the Grace CPU's memory), and anything left over."""
    if text in memory_gb:
        return text
    stated_gb: float | None = None
    form = ""
    family: list[str] = []
    for word in (w for w in re.split(r"[\s_/-]+", text.strip().lower()) if w):
        memory = _MEMORY_WORD.match(word)
        if memory:
            stated_gb = float(memory.group(1))
        elif _FORM_WORD.match(word):
            form = word
        elif word not in _VENDOR_WORDS:
            family.append(word)
    name = "-".join(family)
    found = _by_form(name, form, [n for n in memory_gb if n == name or n.startswith(name + "-")]) if name else None
    known = ", ".join(sorted(memory_gb))
    if found is None:
        raise ValueError(f"unknown GPU model {text!r} (known: {known})")
    held = memory_gb[found]
    if stated_gb is not None and abs(stated_gb - held) > 0.1 * held and stated_gb < 2 * held:
        raise ValueError(f"GPU model {text!r}: the catalogue's {found} has {held:g} GB, not "
                         f"{stated_gb:g} (known: {known})")
    return found


def _by_form(family: str, form: str, names: list[str]) -> str | None:
    """Of a family's catalogue names, the one of form factor `form` ("" where unstated)."""
    forms = {n[len(family) + 1:]: n for n in names if n != family}
    if not forms:  # a family of one board (GB200, H20, MI300X): any form but PCIe is it
        return names[0] if names and form != "pcie" else None
    if not form or form.startswith("sxm"):
        return next((n for f, n in forms.items() if f.startswith("sxm")), None)
    return forms.get(form)


@functools.cache
def _memory_gb() -> dict[str, float]:
    return {n: f.memory_gb for n, f in catalogue().items()}


def gpu_facts(name: str) -> GpuFacts:
    """A part's facts by its catalogue name or a name `part_name` reads as one."""
    return catalogue()[part_name(name, _memory_gb())]


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
