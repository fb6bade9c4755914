"""Topology <-> JSON, losslessly (`parse --format model`), and reading capture-schema JSON back.

The full form carries everything the model knows (bandwidths, health, racks, fabric) and is
what the controller records and `diff` compares. A capture-schema document (the output of
`parse --format json`) also reads back, with default bandwidths, so an operator can keep the
JSON of a known-good node and diff today's capture against it.
"""

from __future__ import annotations

import json
from typing import Any

from topology.errors import ParseError
from topology.kinds import LinkKind
from topology.model import Fabric, Gpu, Link, LinkHealth, MeasuredPath, Nic, Node, Topology
from topology.nvswitch import upgrade_nvswitch

FORMAT = "isleserve-topology/1"


def _health(h: LinkHealth) -> dict[str, Any] | None:
    if h == LinkHealth():
        return None
    return {"score": h.score, "healthy": h.healthy, "bandwidth_factor": h.bandwidth_factor,
            "added_latency_us": h.added_latency_us, "reasons": list(h.reasons)}


def to_dict(topology: Topology) -> dict[str, Any]:
    f = topology.fabric
    return {
        "format": FORMAT,
        "name": topology.name,
        "fingerprint": topology.fingerprint(),
        "fabric": {"kind": f.kind.label, "technology": f.technology, "nic_bandwidth_gb_s": f.nic_bandwidth_gb_s,
                   "latency_us": f.latency_us, "inter_rack_bandwidth_factor": f.inter_rack_bandwidth_factor,
                   "inter_rack_latency_us": f.inter_rack_latency_us,
                   "measured": [{"a": m.a, "b": m.b, "bandwidth_gb_s": m.bandwidth_gb_s, "latency_us": m.latency_us}
                                for m in f.measured]},
        "nodes": [
            {
                "name": n.name, "rack": n.rack, "machine": n.machine, "source_format": n.source_format,
                "gpus": [
                    {"index": g.index, "model": g.model, "pci_bus_id": g.pci_bus_id, "uuid": g.uuid,
                     "numa_node": g.numa_node, "cpu_affinity": g.cpu_affinity, "gpu_numa_node": g.gpu_numa_node,
                     "memory_gb": g.memory_gb, "nvlink_generation": g.nvlink_generation,
                     "fabric_clique": g.fabric_clique, "healthy": g.healthy,
                     "health_reasons": list(g.health_reasons)}
                    for g in n.gpus
                ],
                "nics": [
                    {"name": c.name, "nearest_gpus": list(c.nearest_gpus), "level": c.level.label,
                     "pci_bus_id": c.pci_bus_id, "numa_node": c.numa_node, "speed_gbit_s": c.speed_gbit_s,
                     "link_layer": c.link_layer}
                    for c in n.nics
                ],
                "links": [
                    {"a": k.a, "b": k.b, "kind": k.kind.name.lower(), "lanes": k.lanes,
                     "bandwidth_gb_s": k.bandwidth_gb_s, "latency_us": k.latency_us, "health": _health(k.health)}
                    for k in n.links
                ],
            }
            for n in topology.nodes
        ],
    }


def dumps(topology: Topology) -> str:
    return json.dumps(to_dict(topology), indent=2) + "\n"


def _int(d: dict[str, Any], key: str, minimum: int = 0) -> int:
    value = d[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ParseError(f"topology JSON: {key!r} must be an integer >= {minimum}, got {value!r}")
    return value


def _opt_int(d: dict[str, Any], key: str, minimum: int = 0) -> int | None:
    return None if d.get(key) is None else _int(d, key, minimum)


def _bool(d: dict[str, Any], key: str, default: bool) -> bool:
    value = d.get(key, default)
    if not isinstance(value, bool):
        raise ParseError(f"topology JSON: {key!r} must be true or false, got {value!r}")
    return value


def _link(d: dict[str, Any]) -> Link:
    h = d.get("health")
    health = LinkHealth(score=h["score"], healthy=h["healthy"], bandwidth_factor=h["bandwidth_factor"],
                        added_latency_us=h["added_latency_us"], reasons=tuple(h["reasons"])) if h else LinkHealth()
    return Link(a=_int(d, "a"), b=_int(d, "b"), kind=LinkKind.parse(str(d["kind"])), lanes=_opt_int(d, "lanes", 1),
                bandwidth_gb_s=d.get("bandwidth_gb_s") or 0.0, latency_us=d.get("latency_us") or 0.0,
                health=health)


def _nic(d: dict[str, Any]) -> Nic:
    nearest = d.get("nearest_gpus") or []
    if not isinstance(nearest, list) or not all(isinstance(g, int) and not isinstance(g, bool) for g in nearest):
        raise ParseError(f"topology JSON: NIC {d.get('name')!r} nearest_gpus must be a list of integers")
    return Nic(name=str(d["name"]), nearest_gpus=tuple(nearest), level=LinkKind.parse(str(d["level"])),
               pci_bus_id=d.get("pci_bus_id"), numa_node=d.get("numa_node"), speed_gbit_s=d.get("speed_gbit_s"),
               link_layer=d.get("link_layer"))


def _gpu(d: dict[str, Any]) -> Gpu:
    return Gpu(index=_int(d, "index"), model=d.get("model"), pci_bus_id=d.get("pci_bus_id"), uuid=d.get("uuid"),
               numa_node=_opt_int(d, "numa_node"), cpu_affinity=d.get("cpu_affinity"),
               gpu_numa_node=d.get("gpu_numa_node"), memory_gb=d.get("memory_gb"),
               nvlink_generation=d.get("nvlink_generation"), fabric_clique=d.get("fabric_clique"),
               healthy=_bool(d, "healthy", True), health_reasons=tuple(d.get("health_reasons") or ()))


def _capture_node(d: dict[str, Any], name: str) -> Node:
    return Node(name=name, rack=d.get("rack"), source_format=d.get("source_format", "json"),
                gpus=tuple(_gpu(g) for g in d["gpus"]), links=tuple(upgrade_nvswitch([_link(k) for k in d["links"]])),
                nics=tuple(_nic(c) for c in d.get("nics", [])))


def from_dict(d: dict[str, Any]) -> Topology:
    if d.get("format") == FORMAT:
        f = d["fabric"]
        fabric = Fabric(kind=LinkKind.parse(f["kind"]), technology=f["technology"],
                        nic_bandwidth_gb_s=f["nic_bandwidth_gb_s"], latency_us=f["latency_us"],
                        inter_rack_bandwidth_factor=f["inter_rack_bandwidth_factor"],
                        inter_rack_latency_us=f["inter_rack_latency_us"],
                        measured=tuple(MeasuredPath(a=str(m["a"]), b=str(m["b"]),
                                                    bandwidth_gb_s=float(m["bandwidth_gb_s"]),
                                                    latency_us=float(m["latency_us"])) for m in f.get("measured", [])))
        nodes = tuple(
            Node(name=n["name"], rack=n.get("rack"), machine=n.get("machine"),
                 source_format=n.get("source_format", "json"), gpus=tuple(_gpu(g) for g in n["gpus"]),
                 nics=tuple(_nic(c) for c in n["nics"]), links=tuple(_link(k) for k in n["links"]))
            for n in d["nodes"]
        )
        return Topology(nodes=nodes, fabric=fabric, name=d.get("name", ""))
    if "nodes" in d:
        return Topology(nodes=tuple(_capture_node(n, n["name"]) for n in d["nodes"]))
    if "gpus" in d and "links" in d:
        return Topology(nodes=(_capture_node(d, "node0"),))
    raise ParseError("JSON is neither an isleserve topology nor a `topology parse` document")


def loads(text: str) -> Topology:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise ParseError(f"malformed JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(doc, dict):
        raise ParseError("topology JSON must be an object")
    try:
        return from_dict(doc)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise ParseError(f"topology JSON is missing or has a bad field ({err})") from None
