"""`python -m pools experts`: the expert map of one EP gang of a plan, per layer, with what it does
(balancedness, bytes per token crossing a domain, the MoE step the cost model predicts).

The gang's domains come from `--topology` when given, else from the plan itself: each member's
NVLink domain is the island of the placement's `island` label on its node (`<node>/islandN`),
or the one multi-node domain the label names (`nvl:<clique>`, an NVL72 rack).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from physics import catalog
from physics.costmodel import BF16
from physics.moecost import FP8_DISPATCH_BYTES, Carrier, GangLinks, moe_step
from pools.experts.load import ExpertLoad
from pools.experts.metrics import Gang, LayerStats, replicas, route
from pools.experts.policies import POLICIES
from pools.model import ReplicaPlacement
from topology import GpuRef, Topology

REFERENCE_BATCH, REFERENCE_CONTEXT = 64, 1024
"""The decode step `step_ms` prices: sequences per rank and their context."""


def gang_from_plan(placement: ReplicaPlacement) -> Gang:
    """The gang's GPUs and domains from the plan JSON alone (module docstring)."""
    labels = [x for x in placement.island.split("+") if x]
    shared = [x for x in labels if x.startswith("nvl:")]
    refs, domains = [], []
    for n, g in placement.gpu_refs():
        own = [x for x in labels if x.startswith(f"{n}/island")]
        if len(own) == 1:
            domains.append(own[0])
        elif not own and len(shared) == 1:
            domains.append(shared[0])
        else:
            raise ValueError(f"{placement.replica_id}: cannot tell {n}:gpu{g}'s NVLink domain from the plan "
                             f"(islands {labels}); pass --topology")
        refs.append(GpuRef(n, g))
    return Gang(gpus=tuple(refs), domain=tuple(domains), host=tuple(r.node for r in refs))


def expert_map(model_name: str, placement: ReplicaPlacement, load: ExpertLoad, policy: str, redundant: int,
               topology: Topology | None = None, gpu: str | None = None) -> dict[str, Any]:
    """The answer (`--format json`): per layer `gpu_of` {expert: [EP ranks]} and its figures,
    and the summary over layers."""
    model = catalog.model(model_name)
    if model.moe is None:
        raise ValueError(f"{model_name} is a dense model: no experts to place")
    if policy not in POLICIES:
        raise ValueError(f"unknown expert policy {policy!r} (known: {', '.join(POLICIES)})")
    if load.experts != model.moe.routed_experts:
        raise ValueError(f"the load has {load.experts} experts per layer, {model_name} has {model.moe.routed_experts}")
    if redundant < 0:
        raise ValueError(f"--redundant must be 0 or more, got {redundant}")
    gang = Gang.of(topology, placement) if topology is not None else gang_from_plan(placement)
    physical = model.moe.routed_experts + redundant
    layers, stats = [], []
    for k in range(len(load.layers)):
        shares = load.shares(k)
        layer = POLICIES[policy](shares, gang, physical, model.moe.groups)
        st = route(shares, layer, gang)
        stats.append(st)
        layers.append({"layer": k, "gpu_of": {str(e): where for e, where in enumerate(replicas(layer, len(shares)))},
                       "balancedness": round(st.balancedness, 4), "cross_domain_share": round(st.cross_share, 4)})
    summary = summarize(model_name, gang, stats, placement, topology, gpu)
    return {"policy": policy, "model": model_name, "pool": placement.pool, "replica": placement.replica_id,
            "ep": gang.size, "redundant": redundant, "domains": sorted(set(gang.domain)),
            "ranks": [str(r) for r in gang.gpus], "layers": layers, "summary": summary}


def summarize(model_name: str, gang: Gang, stats: Sequence[LayerStats], placement: ReplicaPlacement,
              topology: Topology | None, gpu: str | None) -> dict[str, Any]:
    model = catalog.model(model_name)
    assert model.moe is not None
    balance = sum(s.balancedness for s in stats) / len(stats)
    cross = sum(s.cross_share for s in stats) / len(stats)
    dispatch = FP8_DISPATCH_BYTES if model.compute != "bf16" else float(BF16)
    per_token = model.moe.moe_layers * model.moe.experts_per_token * cross * model.hidden * (dispatch + BF16)
    gpu_name = gpu or (topology.gpu(gang.gpus[0]).model if topology is not None else None)
    links = _links(gang, placement, topology, cross)
    step = moe_step(model, catalog.gpu(gpu_name or "h100-sxm"), 1, gang.size, links, decodes=REFERENCE_BATCH,
                    decode_context=REFERENCE_CONTEXT, imbalance=1.0 / max(balance, 1e-6))
    return {"balancedness": round(balance, 4), "cross_domain_share": round(cross, 4),
            "cross_domain_bytes_per_token": round(per_token, 1), "step_ms": round(step.total_ms, 3),
            "a2a_share": round(step.a2a_share, 4),
            "step": {"batch_per_rank": REFERENCE_BATCH, "context": REFERENCE_CONTEXT, "carrier": links.carrier,
                     "gpu": gpu_name or "h100-sxm (assumed: pass --gpu or --topology)"}}


def _links(gang: Gang, placement: ReplicaPlacement, topology: Topology | None, cross: float) -> GangLinks:
    if topology is not None:
        from dataclasses import replace

        from pools.ganglinks import gang_links

        base = gang_links(topology, placement)
        return replace(base, outside_share=cross) if base.carrier != "nvlink" else base
    domains = len(set(gang.domain))
    if domains == 1:
        return GangLinks(carrier="nvlink", domain_ranks=gang.size, nvlink_gb_s=450.0)
    per = min(gang.domain.count(d) for d in set(gang.domain))
    carrier: Carrier = "cross-rail" if placement.tier == "rack" else "rdma"
    return GangLinks(carrier=carrier, domain_ranks=per, nvlink_gb_s=450.0, outside_share=cross)


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

