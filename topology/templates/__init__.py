"""Machine templates: real machines, shipped with the product, that cluster specs instantiate.

Each `<name>.yaml` here describes one node type and says what it was derived from: a real
capture in shared/data (named, with its source), or the vendor's published topology. The
product reads them at run time, so they live in the repository, not in shared/.

Imports `topology` only.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from topology.configfile import parse_yaml_text, validate_mapping
from topology.errors import ParseError
from topology.gpus import baseboard_links, gpu_facts
from topology.kinds import LinkKind
from topology.model import Gpu, Link, Nic, Node


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NicTemplate(_Strict):
    name: str
    gpus: list[int] = Field(description="GPUs this NIC is nearest to")
    level: Literal["pix", "pxb", "phb", "node", "sys"] = "pix"
    speed_gbit_s: float = Field(gt=0, description="link speed in Gb/s (400 for NDR)")
    link_layer: Literal["infiniband", "ethernet", "efa"] = "infiniband"


class PcieGroup(_Strict):
    gpus: list[int]
    level: Literal["pix", "pxb", "phb", "node"]


class MachineTemplate(_Strict):
    name: str
    description: str
    derived_from: str = Field(description="capture or vendor document this template follows")
    gpu: str = Field(description="GPU model in topology/data/gpus.yaml")
    gpu_count: int = Field(gt=0, le=64)
    numa: list[int | None] = Field(description="CPU-side NUMA node per GPU")
    cpu_affinity: dict[int, str] = Field(default_factory=dict, description="NUMA node -> CPU list")
    nvlink: Literal["nvswitch", "hybrid-cube-mesh", "pairs", "xgmi", "none", "explicit"] | None = None
    nvlink_pairs: dict[str, int] = Field(default_factory=dict, description="'a-b' -> lanes (explicit)")
    pcie_groups: list[PcieGroup] = Field(default_factory=list)
    nics: list[NicTemplate] = Field(default_factory=list)
    fabric_domain: Literal["node", "rack"] = Field(
        default="node", description="rack: GPUs share one NVLink domain with every tray of the rack (NVL72)"
    )

    @model_validator(mode="after")
    def _check(self) -> MachineTemplate:
        if len(self.numa) != self.gpu_count:
            raise ValueError(f"numa lists {len(self.numa)} GPUs, gpu_count is {self.gpu_count}")
        gpu_facts(self.gpu)
        return self


@functools.cache
def template_names() -> list[str]:
    folder = resources.files("topology.templates")
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))


@functools.cache
def load_template(name: str) -> MachineTemplate:
    if name not in template_names():
        raise ParseError(f"unknown machine template {name!r} (templates: {', '.join(template_names())})")
    text = resources.files("topology.templates").joinpath(f"{name}.yaml").read_text()
    return parse_template(text, f"template {name}")


def _fabric_links(t: MachineTemplate) -> dict[tuple[int, int], Link]:
    facts = gpu_facts(t.gpu)
    if t.nvlink == "explicit":
        links = []
        for pair, lanes in t.nvlink_pairs.items():
            a, b = sorted(int(x) for x in pair.split("-"))
            links.append(Link(a=a, b=b, kind=LinkKind.NVLINK, lanes=lanes))
    else:
        links = baseboard_links(facts, t.gpu_count, t.nvlink)
    return {(k.a, k.b): k for k in links}


def _pcie_kind(t: MachineTemplate, a: int, b: int) -> LinkKind:
    for group in t.pcie_groups:
        if a in group.gpus and b in group.gpus:
            return LinkKind.parse(group.level)
    na, nb = t.numa[a], t.numa[b]
    return LinkKind.NODE if na is not None and na == nb else LinkKind.SYS


def parse_template(text: str, source: str) -> MachineTemplate:
    """A machine template from a file of its own (the packaged ones are read by name)."""
    raw = parse_yaml_text(text, "machine template", source)
    return validate_mapping(MachineTemplate, raw, "machine template", "a machine template is a YAML mapping", source)


def node_from_template(name: str, node_name: str, rack: str | None = None) -> Node:
    return node_from_machine(load_template(name), node_name, rack)


def node_from_machine(t: MachineTemplate, node_name: str, rack: str | None = None) -> Node:
    facts = gpu_facts(t.gpu)
    fabric = _fabric_links(t)
    links = []
    for a in range(t.gpu_count):
        for b in range(a + 1, t.gpu_count):
            link = fabric.get((a, b)) or Link(a=a, b=b, kind=_pcie_kind(t, a, b))
            bw = facts.link_gb_s(link.kind, link.lanes)
            links.append(Link(a=a, b=b, kind=link.kind, lanes=link.lanes, bandwidth_gb_s=bw))
    clique = None
    if t.fabric_domain == "rack":
        clique = f"{rack or node_name}/{t.name}"
    gpus = tuple(
        Gpu(index=i, model=facts.name, numa_node=t.numa[i], cpu_affinity=t.cpu_affinity.get(t.numa[i] or 0)
            if t.numa[i] is not None else None, memory_gb=facts.memory_gb,
            nvlink_generation=facts.nvlink_generation, fabric_clique=clique)
        for i in range(t.gpu_count)
    )
    nics = tuple(
        Nic(name=n.name, nearest_gpus=tuple(sorted(n.gpus)), level=LinkKind.parse(n.level),
            speed_gbit_s=n.speed_gbit_s, link_layer=n.link_layer)
        for n in t.nics
    )
    return Node(name=node_name, gpus=gpus, links=tuple(links), nics=nics, rack=rack, machine=t.name,
                source_format="template")
