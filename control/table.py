"""The routing table a plan and the running replicas imply (pure): each endpoint carries the
health of its TP group's links and GPUs, and whether it is draining."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace
from itertools import combinations

from pools.model import PlacementPlan, ReplicaPlacement
from pools.routing import EngineKind, RoutingTable, table_from_plan
from topology import Topology


def group_health(topology: Topology, p: ReplicaPlacement) -> tuple[bool, float]:
    """(healthy, worst link score) of the placement's GPUs. Only a lost node or GPU makes it
    unhealthy (the router then sends it nothing); a bad link lowers the score, and the
    controller drains and moves the replica, so batch traffic may still use it meanwhile. A gang:
    every member (a lost GPU anywhere stops the whole gang), links inside each TP group."""
    score = 1.0
    groups = [(m.node, m.gpus) for m in p.members] if p.members else [(p.node, p.gpus), *p.extra_nodes]
    for node_name, gpus in groups:
        if not topology.has_node(node_name):
            return False, 0.0
        node = topology.node(node_name)
        for g in gpus:
            if not node.has_gpu(g) or not node.gpu(g).healthy:
                return False, 0.0
        for a, b in combinations(sorted(gpus), 2):
            link = node.link(a, b)
            if link is not None:
                score = min(score, link.health.score)
    return True, score


def build_table(plan: PlacementPlan, topology: Topology, urls: Mapping[str, str], draining: Collection[str],
                version: int, served_names: Mapping[str, str] | None = None,
                engine: EngineKind = "sim", publishing: Collection[str] = ()) -> RoutingTable:
    """`served_names`: pool -> the model id its engines serve (vLLM's served name), when not the
    pool's catalogue model; `engine`: what serves every replica (the spec's engine); `publishing`:
    the replicas whose engines publish their prefix caches' events to the router."""
    served = {p.name: (served_names or {}).get(p.name) or p.model or p.name for p in plan.pools}
    gpu_models = {}
    for p in plan.placements:
        node = topology.node(p.node) if topology.has_node(p.node) else None
        gpu_models[p.replica_id] = node.gpu(p.gpus[0]).model if node and node.has_gpu(p.gpus[0]) else None
    table = table_from_plan(plan, dict(urls), served, version=version, gpu_models=gpu_models, engine=engine)
    by_id = {p.replica_id: p for p in plan.placements}
    endpoints = []
    for r in table.replicas:
        rid = r.gang or r.replica_id  # a gang's rank: the gang's placement and state
        healthy, score = group_health(topology, by_id[rid])
        endpoints.append(replace(r, healthy=healthy, health_score=round(score, 4), draining=rid in draining,
                                 kv_events=r.replica_id in publishing))
    return replace(table, replicas=tuple(endpoints), topology_fingerprint=topology.fingerprint())
