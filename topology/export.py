"""The capture schema of `python -m topology parse --format json` (DESIGN.md contract).

Keys, in order: source_format, gpu_count, gpus (index, numa_node, cpu_affinity), links (one per
GPU pair, a < b; kind in the capture's vocabulary, NVSwitch printed as nvlink; lanes only for
nvlink), islands, cliques, nics (name, nearest_gpus, level). The text layout matches the
reference files byte for byte: one array element per line.
"""

from __future__ import annotations

import json
from typing import Any

from topology.islands import cliques, islands
from topology.kinds import LinkKind
from topology.model import Node, Topology


def _link_json(kind: LinkKind, lanes: int | None) -> dict[str, Any]:
    is_nv = kind in (LinkKind.NVLINK, LinkKind.NVSWITCH)
    return {"kind": kind.label, "lanes": lanes if is_nv else None}


def node_capture(node: Node, source_format: str | None = None) -> dict[str, Any]:
    single = Topology(nodes=(node,))
    gpus = sorted(node.gpus, key=lambda g: g.index)
    return {
        "source_format": source_format or node.source_format,
        "gpu_count": len(gpus),
        "gpus": [
            {"index": g.index, "numa_node": g.numa_node, "cpu_affinity": g.cpu_affinity} for g in gpus
        ],
        "links": [
            {"a": k.a, "b": k.b, **_link_json(k.kind, k.lanes)}
            for k in sorted(node.links, key=lambda k: (k.a, k.b))
        ],
        "islands": sorted(sorted(r.index for r in isl.gpus) for isl in islands(single)),
        "cliques": sorted(sorted(r.index for r in c) for c in cliques(single)),
        "nics": [
            {"name": n.name, "nearest_gpus": sorted(n.nearest_gpus), "level": n.level.name}
            for n in sorted(node.nics, key=lambda n: n.name)
        ],
    }


def topology_capture(topology: Topology) -> dict[str, Any]:
    """One node: the capture schema itself. Several: the schema per node under `nodes`."""
    if len(topology.nodes) == 1:
        return node_capture(topology.nodes[0])
    return {
        "source_format": "cluster",
        "topology_fingerprint": topology.fingerprint(),
        "nodes": [{"name": n.name, "rack": n.rack, **node_capture(n)} for n in topology.nodes],
    }


def _dump(value: Any, indent: int) -> str:
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = [f'{pad}  {json.dumps(k)}: {_dump(v, indent + 2)}' for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(value, list) and value and isinstance(value[0], (dict, list)):
        items = [f"{pad}  {_inline(v) if _flat(v) else _dump(v, indent + 2)}" for v in value]
        return "[\n" + ",\n".join(items) + f"\n{pad}]"
    return json.dumps(value)


def _flat(value: Any) -> bool:
    if isinstance(value, dict):
        return all(not isinstance(v, (dict, list)) or (isinstance(v, list) and all(
            not isinstance(x, (dict, list)) for x in v)) for v in value.values())
    if isinstance(value, list):
        return all(not isinstance(v, (dict, list)) for v in value)
    return True


def _inline(value: Any) -> str:
    return json.dumps(value)


def dumps(document: dict[str, Any]) -> str:
    """Serialise in the reference files' layout (ends with a newline)."""
    return _dump(document, 0) + "\n"
