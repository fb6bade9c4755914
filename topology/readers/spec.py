"""Declared clusters (`configs/clusters/*.yaml`): nodes made from machine templates or captures.

    name: local-sim
    fabric: {technology: ib-ndr}          # or roce-200, tcp-25, ... (see FABRICS)
    racks:
      - name: rack0
        nodes:
          - {name: h100, template: hgx-h100, count: 2}
    nodes:
      - name: pcie-box
        template: rtx4090-pcie
      - name: h100-bad
        template: hgx-h100
        degraded_links: [{gpus: [2, 3], lanes_active: 9, replay_per_min: 40}]
      - {name: a30, capture: ../captures/a30.txt, gpu: a30}

Every problem in a spec is reported at once, each with its path (`racks[0].nodes[1].template`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from topology.configfile import parse_yaml_text, validate_mapping
from topology.errors import ParseError
from topology.health import XID_FELL_OFF_BUS, GpuCounters, HealthThresholds, LinkCounters, apply_node_health
from topology.kinds import LinkKind
from topology.model import Fabric, Node, Topology
from topology.readers.capture import ReadOptions, decode, read_node_text
from topology.templates import node_from_template, template_names

FABRICS: dict[str, tuple[LinkKind, float, float]] = {
    # technology -> (kind, Gb/s per NIC, latency us). IB rates from the IBTA roadmap
    # (EDR 100, HDR 200, NDR 400, XDR 800 Gb/s); RDMA latency per NCCL's NET hwLat (~3 us);
    # EFA per AWS (p4d: 4x 100 Gb/s, SRD adds ~10 us); TCP latency ~30-50 us per hop.
    "ib-xdr": (LinkKind.RDMA, 800.0, 3.0),
    "ib-ndr": (LinkKind.RDMA, 400.0, 3.0),
    "ib-hdr": (LinkKind.RDMA, 200.0, 3.0),
    "ib-edr": (LinkKind.RDMA, 100.0, 3.0),
    "roce-400": (LinkKind.RDMA, 400.0, 4.0),
    "roce-200": (LinkKind.RDMA, 200.0, 4.0),
    "roce-100": (LinkKind.RDMA, 100.0, 4.0),
    "roce-25": (LinkKind.RDMA, 25.0, 5.0),
    "efa": (LinkKind.RDMA, 100.0, 15.0),
    "tcp-100": (LinkKind.TCP, 100.0, 30.0),
    "tcp-25": (LinkKind.TCP, 25.0, 40.0),
    "tcp-10": (LinkKind.TCP, 10.0, 50.0),
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DegradedLink(_Strict):
    gpus: tuple[int, int] = Field(description="the two GPU indices of the link")
    lanes_active: int | None = Field(default=None, ge=0, description="NVLink lanes still up")
    replay_per_min: float = Field(default=0.0, ge=0)
    recovery_per_min: float = Field(default=0.0, ge=0)
    crc_per_min: float = Field(default=0.0, ge=0)


class DegradedGpu(_Strict):
    gpu: int = Field(ge=0, description="GPU whose NVLink ports are degraded (all its NVLink links)")
    lanes_active: int | None = Field(default=None, ge=0, description="NVLink lanes still up")
    replay_per_min: float = Field(default=0.0, ge=0)
    recovery_per_min: float = Field(default=0.0, ge=0)
    crc_per_min: float = Field(default=0.0, ge=0)


class NodeSpec(_Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    template: str | None = Field(default=None, description="machine template name")
    capture: str | None = Field(default=None, description="capture or NCCL XML, relative to the spec")
    gpu: str | None = Field(default=None, description="GPU model of a capture")
    count: int = Field(default=1, ge=1, le=4096, description="nodes named <name>-00, -01, ...")
    rack: str | None = None
    degraded_links: list[DegradedLink] = Field(default_factory=list, description="one bond (bridges, meshes)")
    degraded_gpus: list[DegradedGpu] = Field(
        default_factory=list, description="a GPU's NVLink ports (NVSwitch boards: every pair it is in)"
    )
    failed_gpus: list[int] = Field(default_factory=list, description="GPUs that fell off the bus")

    @model_validator(mode="after")
    def _one_source(self) -> NodeSpec:
        if (self.template is None) == (self.capture is None):
            raise ValueError("give exactly one of template or capture")
        if self.template is not None and self.template not in template_names():
            raise ValueError(f"unknown template {self.template!r} (templates: {', '.join(template_names())})")
        return self


class RackSpec(_Strict):
    name: str = Field(min_length=1)
    nodes: list[NodeSpec]


class FabricSpec(_Strict):
    technology: Literal[tuple(FABRICS)] = "ib-ndr"  # type: ignore[valid-type]
    bandwidth_gbit_s: float | None = Field(default=None, gt=0, description="override per-NIC speed")
    latency_us: float | None = Field(default=None, gt=0)
    inter_rack_bandwidth_factor: float = Field(default=0.5, gt=0, le=1)
    inter_rack_latency_us: float = Field(default=2.0, ge=0)


class HealthSpec(_Strict):
    nvlink_replay_per_min: float = Field(default=10.0, gt=0)
    nvlink_recovery_per_min: float = Field(default=1.0, gt=0)
    nvlink_crc_per_min: float = Field(default=10.0, gt=0)
    pcie_replay_per_min: float = Field(default=10.0, gt=0)
    min_healthy_score: float = Field(default=0.5, ge=0, le=1)


class ClusterSpec(_Strict):
    name: str = "cluster"
    fabric: FabricSpec = FabricSpec()
    racks: list[RackSpec] = Field(default_factory=list)
    nodes: list[NodeSpec] = Field(default_factory=list)
    health: HealthSpec = HealthSpec()

    @model_validator(mode="after")
    def _some_nodes(self) -> ClusterSpec:
        if not self.racks and not self.nodes:
            raise ValueError("a cluster spec needs `nodes` or `racks`")
        return self


def _fabric(spec: FabricSpec) -> Fabric:
    kind, gbit, latency = FABRICS[spec.technology]
    return Fabric(
        kind=kind,
        technology=spec.technology,
        nic_bandwidth_gb_s=(spec.bandwidth_gbit_s or gbit) / 8.0,
        latency_us=spec.latency_us or latency,
        inter_rack_bandwidth_factor=spec.inter_rack_bandwidth_factor,
        inter_rack_latency_us=spec.inter_rack_latency_us,
    )


def _base_node(spec: NodeSpec, name: str, rack: str | None, base_dir: Path | None) -> Node:
    if spec.template is not None:
        return node_from_template(spec.template, name, rack)
    path = Path(spec.capture or "")
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    try:
        text = decode(path.read_bytes(), str(path))
    except OSError as err:
        raise ParseError(f"node {spec.name}: cannot read capture {path}: {err.strerror}") from None
    node = read_node_text(text, ReadOptions(node_name=name, gpu=spec.gpu))
    return replace(node, rack=rack, machine=node.machine or path.name)


def _nodes(spec: NodeSpec, rack: str | None, base_dir: Path | None, th: HealthThresholds) -> list[Node]:
    width = len(str(spec.count - 1))
    names = [spec.name] if spec.count == 1 else [f"{spec.name}-{i:0{width}d}" for i in range(spec.count)]
    out = []
    for name in names:
        node = _base_node(spec, name, rack or spec.rack, base_dir)
        links: dict[tuple[int, int], LinkCounters] = {}
        for dg in spec.degraded_gpus:
            if not node.has_gpu(dg.gpu):
                raise ParseError(f"node {name}: degraded_gpus names GPU{dg.gpu}, which it does not have")
            for link in node.links:
                if dg.gpu in (link.a, link.b) and link.kind.is_gpu_fabric:
                    active = None if dg.lanes_active is None else min(dg.lanes_active, link.lanes or dg.lanes_active)
                    links[(link.a, link.b)] = LinkCounters(
                        lanes_total=link.lanes, lanes_active=active, replay_per_min=dg.replay_per_min,
                        recovery_per_min=dg.recovery_per_min, crc_per_min=dg.crc_per_min)
        for d in spec.degraded_links:
            a, b = sorted(d.gpus)
            if node.link(a, b) is None:
                raise ParseError(f"node {name}: degraded_links names GPU{a}-GPU{b}, which it does not have")
            lanes = node.link(a, b).lanes  # type: ignore[union-attr]
            links[(a, b)] = LinkCounters(lanes_total=lanes, lanes_active=d.lanes_active,
                                         replay_per_min=d.replay_per_min, recovery_per_min=d.recovery_per_min,
                                         crc_per_min=d.crc_per_min)
        gpus = {}
        for g in spec.failed_gpus:
            if not node.has_gpu(g):
                raise ParseError(f"node {name}: failed_gpus names GPU{g}, which it does not have")
            gpus[g] = GpuCounters(xids=(XID_FELL_OFF_BUS,))
        out.append(apply_node_health(node, links, gpus, th) if links or gpus else node)
    return out


def build_topology(spec: ClusterSpec, base_dir: Path | None = None) -> Topology:
    th = HealthThresholds(**spec.health.model_dump())
    nodes: list[Node] = []
    for rack in spec.racks:
        for n in rack.nodes:
            nodes.extend(_nodes(n, rack.name, base_dir, th))
    for n in spec.nodes:
        nodes.extend(_nodes(n, None, base_dir, th))
    counts = Counter(n.name for n in nodes)
    dupes = sorted(name for name, k in counts.items() if k > 1)
    if dupes:
        raise ParseError(f"duplicate node names: {', '.join(dupes)}")
    return Topology(nodes=tuple(nodes), fabric=_fabric(spec.fabric), name=spec.name)


def parse_spec(text: str, base_dir: Path | None = None) -> Topology:
    raw = parse_yaml_text(text, "cluster spec")
    spec = validate_mapping(ClusterSpec, raw, "cluster spec", "cluster spec must be a YAML mapping")
    return build_topology(spec, base_dir)
