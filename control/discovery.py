"""Topology discovery on a Ray cluster: one task per alive node, pinned there by node affinity,
merged into one cluster topology.

- `nvml`: each node discovers itself through NVML (a node without GPUs or driver adds nothing);
  it is named by its `isle.io/node` label, else by its host name.
- a declared cluster spec (simulation): each node reads the spec and answers with the declared
  node it carries (`isle.io/node` label or `isle_gpu_<node>_<i>` resources); declared nodes no
  Ray node carries stay in the topology, simulated unpinned.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from control.backend import Discovery
from control.nodecheck import NODE_LABEL, RayNode
from topology import Topology, TopologyError, read_source
from topology.model import Node

DISCOVERY_TIMEOUT_S = 60.0
COUNTER_SAMPLE_S = 2.0
log = logging.getLogger("isleserve.controller")


def ray_nodes() -> list[RayNode]:
    listed: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
    return [RayNode(node_id=n["NodeID"], labels=dict(n.get("Labels") or {}), resources=dict(n.get("Resources") or {}),
                    address=str(n.get("NodeManagerHostname") or n.get("NodeManagerAddress") or ""),
                    alive=bool(n.get("Alive"))) for n in listed]


def discover_node(source: str, ray_node: RayNode) -> Node | None:
    """Runs on `ray_node`: its own node of the cluster topology, or None when it has none."""
    if source == "nvml":
        from topology.readers.nvml import discover

        name = ray_node.labels.get(NODE_LABEL) or ray_node.address or ray_node.node_id[:12]
        try:  # error counters read twice, COUNTER_SAMPLE_S apart: replay and CRC rates score the links
            return discover(node_name=name, sample_s=COUNTER_SAMPLE_S)
        except (TopologyError, ImportError) as err:
            log.info("node %s: no GPUs discovered (%s)", name, err)
            return None
    declared = read_source(source)
    return next((n for n in declared.nodes if ray_node.carries(n.name)), None)


_remote: Any = ray.remote
_discover_task: Any = _remote(num_cpus=0, max_retries=1)(discover_node)


def merge(source: str, found: list[tuple[RayNode, Node]]) -> Discovery:
    """One cluster topology from the nodes' answers (pure)."""
    bindings = {node.name: ray_node for ray_node, node in found}
    if source == "nvml":
        return Discovery(topology=Topology(nodes=tuple(n for _, n in found), name="nvml"), bindings=bindings,
                         simulated=False)
    declared = read_source(source)
    answered = {n.name: n for _, n in found}
    nodes = tuple(answered.get(n.name, n) for n in declared.nodes)
    return Discovery(topology=replace(declared, nodes=nodes), bindings=bindings, simulated=True)


def discover_cluster(source: str) -> Discovery:
    alive = [n for n in ray_nodes() if n.alive]
    refs = [_discover_task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, soft=False))
            .remote(source, n) for n in alive]
    found: list[tuple[RayNode, Node]] = []
    for ray_node, ref in zip(alive, refs, strict=True):
        try:
            node = ray.get(ref, timeout=DISCOVERY_TIMEOUT_S)
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayError) as err:
            log.warning("discovery on Ray node %s failed: %s", ray_node.node_id[:12], err)
            continue
        if node is not None:
            found.append((ray_node, node))
    return merge(source, found)
