"""Topology into Ray's scheduling vocabulary, so other Ray workloads can use it too.

`python -m pools node-labels` runs discovery on a node (NVML by default, or any topology
source for simulated nodes) and prints the `ray start` arguments that declare it:

- labels under the project's prefix (Ray reserves `ray.io/`): `isle.io/node`,
  `isle.io/gpu-model`, `isle.io/gpus`, `isle.io/nvlink-domain` (the fabric clique for
  multi-node NVLink domains, else the node), `isle.io/islands` (island sizes, largest first),
  `isle.io/rack`, `isle.io/topology` (the node's digest: drift shows up as a changed label);
- resources: one `isle_gpu_<node>_<i>` per healthy GPU (the controller pins a replica to exactly
  its planned GPUs with them, Ray's `num_gpus` left out of it) and one `isle_island_<node>_<k>`
  per island, sized by its healthy GPUs (a TP group asks for `tp` of one island).
"""

from __future__ import annotations

import json
import re

from topology import Topology, islands
from topology.model import Node

PREFIX = "isle.io/"
_VALUE = re.compile(r"[^A-Za-z0-9_.-]+")


def label_value(text: str) -> str:
    """Ray label values: letters, digits, '-', '_', '.', at most 63, starting and ending alphanumeric."""
    value = _VALUE.sub("-", text).strip("-_.")[:63].strip("-_.")
    return value or "none"


def resource_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]+", "_", text)


def node_labels(topology: Topology, node: Node) -> dict[str, str]:
    found = [i for i in islands(topology) if node.name in i.nodes]
    sizes = sorted((sum(1 for g in i.gpus if g.node == node.name) for i in found), reverse=True)
    domain = next((g.fabric_clique for g in node.gpus if g.fabric_clique), None) or node.name
    model = next((g.model for g in node.gpus if g.model), None) or "unknown"
    labels = {
        "node": node.name, "gpu-model": model, "gpus": str(len(node.gpus)), "nvlink-domain": domain,
        "islands": "_".join(str(s) for s in sizes) or "0",
        "topology": Topology(nodes=(node,)).fingerprint()[:12],
    }
    if node.rack:
        labels["rack"] = node.rack
    return {PREFIX + k: label_value(v) for k, v in labels.items()}


def node_resources(topology: Topology, node: Node) -> dict[str, float]:
    base = resource_name(node.name)
    out: dict[str, float] = {f"isle_gpu_{base}_{g.index}": 1.0 for g in node.gpus if g.healthy}
    for k, isl in enumerate(i for i in islands(topology) if node.name in i.nodes):
        healthy = sum(1 for g in isl.gpus if g.node == node.name and topology.gpu(g).healthy)
        if healthy:
            out[f"isle_island_{base}_{k}"] = float(healthy)
    return out


def ray_start_args(topology: Topology, node: Node) -> str:
    labels = ",".join(f"{k}={v}" for k, v in node_labels(topology, node).items())
    resources = json.dumps(node_resources(topology, node), separators=(",", ":"))
    return f"--num-gpus={len(node.gpus)} --labels=\"{labels}\" --resources='{resources}'"
