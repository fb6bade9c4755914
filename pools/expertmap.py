"""`python -m pools experts`: the expert map of one EP gang of a plan, per layer, with what it does
(balancedness, bytes per token crossing a domain, the MoE step the cost model predicts).

The gang's domains come from `--topology` when given, else from the plan itself: each member's
NVLink domain is the island of the placement's `island` label on its node (`<node>/islandN`),
or the one multi-node domain the label names (`nvl:<clique>`, an NVL72 rack).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from physics import catalog
from physics.alltoall import DISPATCH_BYTES, GangLinks, default_dispatch
from physics.costmodel import BF16
from pools.experts.load import ExpertLoad
from pools.experts.metrics import Gang, gang_from_plan, replicas, route
from pools.experts.objective import (
    REFERENCE_BATCH,
    REFERENCE_CONTEXT,
    REFERENCE_PREFILL_TOKENS,
    Phase,
    objective,
    plain_links,
)
from pools.experts.objective import step as gang_step
from pools.experts.policies import POLICIES, eplb
from pools.experts.policies import topology as topology_policy
from pools.model import ReplicaPlacement
from topology import Topology


def expert_map(model_name: str, placement: ReplicaPlacement, load: ExpertLoad, policy: str, redundant: int,
               topology: Topology | None = None, gpu: str | None = None, locality: bool = True) -> dict[str, Any]:
    """The answer (`--format json`) for one gang of a plan: `map_gang`'s, with the pool and replica."""
    gang = Gang.of(topology, placement) if topology is not None else gang_from_plan(placement)
    if topology is not None:
        from pools.ganglinks import gang_links

        links = gang_links(topology, placement)
    else:
        links = plain_links(gang, "cross-rail" if placement.tier == "rack" else "rdma", 450.0)
    gpu_name = gpu or (topology.gpu(gang.gpus[0]).model if topology is not None else None)
    answer = map_gang(model_name, gang, links, gpu_name, "prefill" if placement.role == "prefill" else "decode",
                      load, policy, redundant, locality)
    return {**answer, "pool": placement.pool, "replica": placement.replica_id}


def map_gang(model_name: str, gang: Gang, links: GangLinks, gpu: str | None, phase: Phase, load: ExpertLoad,
             policy: str, redundant: int, locality: bool = True) -> dict[str, Any]:
    """Per layer `gpu_of` {expert: [EP ranks]} and its figures, and the summary over layers. The
    `topology` policy minimises the step `pools.experts.objective` predicts (EPLB's map where that
    is at least as fast: such layers say `"map": "eplb"`)."""
    model = catalog.model(model_name)
    if model.moe is None:
        raise ValueError(f"{model_name} is a dense model: no experts to place")
    if policy not in POLICIES:
        raise ValueError(f"unknown expert policy {policy!r} (known: {', '.join(POLICIES)})")
    if load.experts != model.moe.routed_experts:
        raise ValueError(f"the load has {load.experts} experts per layer, {model_name} has {model.moe.routed_experts}")
    if redundant < 0:
        raise ValueError(f"--redundant must be 0 or more, got {redundant}")
    gpu_spec = catalog.gpu(gpu or "h100-sxm")
    step = objective(model, gpu_spec, links, gang.size, phase)
    physical = model.moe.routed_experts + redundant
    layers, stats, steps = [], [], []
    for k in range(len(load.layers)):
        shares = load.shares(k)
        if policy == "topology":
            rival = eplb(shares, gang, physical, model.moe.groups)
            layer = topology_policy(shares, gang, physical, model.moe.groups, step=step, locality=locality,
                                    rival=rival)
        else:
            layer = POLICIES[policy](shares, gang, physical, model.moe.groups)
        st = route(shares, layer, gang, locality)
        stats.append(st)
        steps.append(step(st))
        layers.append({"layer": k, "gpu_of": {str(e): where for e, where in enumerate(replicas(layer, len(shares)))},
                       "balancedness": round(st.balancedness, 4), "cross_domain_share": round(st.cross_share, 4),
                       "step_ms": round(steps[-1], 3),
                       "map": "eplb" if policy == "topology" and layer == rival else policy})
    balance = sum(s.balancedness for s in stats) / len(stats)
    cross = sum(s.cross_share for s in stats) / len(stats)
    dispatch = DISPATCH_BYTES[default_dispatch(model.compute)]
    per_token = model.moe.moe_layers * model.moe.experts_per_token * cross * model.hidden * (dispatch + BF16)
    a2a = gang_step(model, gpu_spec, links, gang.size, balance, cross, phase).a2a_share
    summary = {"balancedness": round(balance, 4), "cross_domain_share": round(cross, 4),
               "cross_domain_bytes_per_token": round(per_token, 1), "step_ms": round(sum(steps) / len(steps), 3),
               "a2a_share": round(a2a, 4),
               "eplb_layers": sum(1 for x in layers if x["map"] == "eplb"),
               "step": {"phase": phase, "batch_per_rank": REFERENCE_BATCH if phase == "decode" else None,
                        "context": REFERENCE_CONTEXT if phase == "decode" else None,
                        "prefill_tokens_per_rank": REFERENCE_PREFILL_TOKENS if phase == "prefill" else None,
                        "carrier": links.carrier, "gpu": gpu or "h100-sxm (assumed: pass --gpu or --topology)"}}
    return {"policy": policy, "model": model_name, "ep": gang.size, "redundant": redundant, "locality": locality,
            "domains": sorted(set(gang.domain)), "ranks": [str(r) for r in gang.gpus], "layers": layers,
            "summary": summary}


def placement_of(doc: Mapping[str, Any], pool: str, replica: str | None) -> dict[str, Any]:
    found = [p for p in doc.get("placements", []) if p.get("pool") == pool
             and (replica is None or p.get("replica_id") == replica)]
    if not found:
        raise ValueError(f"the plan places no replica {replica or ''} of pool {pool}".replace("  ", " "))
    chosen: dict[str, Any] = found[0]
    if not chosen.get("members") or not chosen.get("expert_parallel"):
        raise ValueError(f"{chosen.get('replica_id')}: not an expert-parallel gang (no members / expert_parallel)")
    return chosen


def read_plan(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            doc: dict[str, Any] = json.load(f)
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"--plan {path}: {err}") from None
    return doc

