"""Which Ray node is which topology node, and whether running Ray nodes carry the labels and
resources `python -m pools node-labels` would give them (pure: Ray's node list comes in as data).

A Ray node is bound to a topology node by its `isle.io/node` label, else by the per-GPU
resources `isle_gpu_<node>_<i>` it declares. Under NVML discovery every Ray node is its own
topology node (the discovery task ran there); in simulation a declared node no Ray node carries
is still simulated, unpinned, and the report says so: as a note (info), since that is how a
simulated cluster runs on one local Ray, where real problems are warnings.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pools.nodelabels import PREFIX, label_value, node_labels, node_resources, resource_name
from topology import Topology

NODE_LABEL = PREFIX + "node"


@dataclass(frozen=True, slots=True, kw_only=True)
class RayNode:
    node_id: str
    labels: Mapping[str, str] = field(default_factory=dict)
    resources: Mapping[str, float] = field(default_factory=dict)
    address: str = ""
    alive: bool = True

    def carries(self, node: str) -> bool:
        if self.labels.get(NODE_LABEL) == label_value(node):
            return True
        prefix = f"isle_gpu_{resource_name(node)}_"
        return any(k.startswith(prefix) and k[len(prefix):].isdigit() for k in self.resources)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeReport:
    ok: tuple[str, ...] = ()
    """Topology nodes whose Ray node carries every expected label and resource."""
    problems: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Per topology node (or Ray node id): what is missing or different."""
    unpinned: tuple[str, ...] = ()
    """Simulated nodes no Ray node carries (also in `problems`): expected on a local Ray."""

    def to_json(self) -> dict[str, object]:
        return {"ok": list(self.ok), "problems": {k: list(v) for k, v in self.problems.items()}}

    def lines(self) -> list[tuple[int, str]]:
        """Each line with its logging level: info for a simulated node no Ray node carries,
        warning for the rest."""
        return [(logging.INFO, f"simulated node {node} has no Ray node (simulated nodes have none unless a Ray "
                               f"node was started with their labels); its replicas run unpinned on any Ray node")
                if node in self.unpinned else (logging.WARNING, f"{node}: {'; '.join(why)}")
                for node, why in sorted(self.problems.items())]


def bind(topology: Topology, ray_nodes: Sequence[RayNode]) -> dict[str, RayNode]:
    """Topology node name -> the alive Ray node that carries it (first one wins)."""
    out: dict[str, RayNode] = {}
    for node in topology.nodes:
        found = next((r for r in ray_nodes if r.alive and r.carries(node.name)), None)
        if found is not None:
            out[node.name] = found
    return out


def _differences(expected_labels: Mapping[str, str], expected_resources: Mapping[str, float],
                 ray: RayNode) -> list[str]:
    out = []
    for key, value in sorted(expected_labels.items()):
        have = ray.labels.get(key)
        if have is None:
            out.append(f"label {key}={value} missing")
        elif have != value:
            out.append(f"label {key} is {have}, expected {value}")
    for key, amount in sorted(expected_resources.items()):
        if key not in ray.resources:
            out.append(f"resource {key} missing")
        elif ray.resources[key] != amount:
            out.append(f"resource {key} is {ray.resources[key]:g}, expected {amount:g}")
    return out


def check(topology: Topology, bound: Mapping[str, RayNode], simulated: bool) -> NodeReport:
    """Compare what each bound Ray node carries with what its topology node (as discovered, before
    any health mark) implies."""
    ok: list[str] = []
    unpinned: list[str] = []
    problems: dict[str, tuple[str, ...]] = {}
    for node in topology.nodes:
        ray = bound.get(node.name)
        if ray is None:
            if simulated:
                why = (f"simulated node: no Ray node carries it (none does on a local Ray), so its replicas run "
                       f"unpinned; `python -m pools node-labels --source <cluster spec> --node {node.name}` gives "
                       f"the `ray start` arguments for one")
                unpinned.append(node.name)
            else:
                why = "no Ray node for it"
            problems[node.name] = (why,)
            continue
        diff = _differences(node_labels(topology, node), node_resources(topology, node), ray)
        if diff:
            problems[node.name] = (f"Ray node {ray.node_id[:12]}: " + "; ".join(diff),)
        else:
            ok.append(node.name)
    return NodeReport(ok=tuple(ok), problems=problems, unpinned=tuple(unpinned))
