"""`python -m pools bench`: plan a 1,024-node (8,192-GPU) mixed cluster with about 2,000
replicas, then re-plan after one node fails; print both wall times.

The cluster: 32 racks of 32 nodes (16 HGX H100, 8 DGX A100, 4 H100 NVL pair boxes, 4 RTX
4090 PCIe boxes per rack) on NDR InfiniBand. The pools: Qwen2.5-32B prefill TP=4 and decode
TP=2, Llama-3.1-70B TP=8, and Llama-3.1-8B TP=1, across three SLO classes.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace

from pools.model import PlacementRequest, PoolSpec
from pools.placement import get_policy
from pools.placement.replan import replan
from topology import Topology
from topology.readers.spec import parse_spec

RACK = [("h100", "hgx-h100", 16), ("a100", "dgx-a100", 8), ("nvl", "h100-nvl-pairs", 4), ("pcie", "rtx4090-pcie", 4)]
POOLS = (
    PoolSpec(name="prefill", role="prefill", tp=4, replicas=400, model="qwen2.5-32b", slo_classes=("interactive",)),
    PoolSpec(name="decode", role="decode", tp=2, replicas=800, model="qwen2.5-32b", slo_classes=("interactive",)),
    PoolSpec(name="big", role="mixed", tp=8, replicas=100, model="llama-3.1-70b", slo_classes=("standard",)),
    PoolSpec(name="small", role="mixed", tp=1, replicas=700, model="llama-3.1-8b", slo_classes=("batch",)),
)


def cluster(racks: int = 32) -> Topology:
    lines = ["name: bench", "fabric: {technology: ib-ndr}", "racks:"]
    for r in range(racks):
        lines.append(f"  - name: r{r:02d}\n    nodes:")
        lines.extend(f"      - {{name: r{r:02d}-{prefix}, template: {t}, count: {n}}}" for prefix, t, n in RACK)
    return parse_spec("\n".join(lines) + "\n")


def run(policy: str = "island-aligned", racks: int = 32) -> dict[str, float | int | str]:
    topology = cluster(racks)
    request = PlacementRequest(topology=topology, pools=POOLS)
    start = time.perf_counter()
    plan = get_policy(policy).place(request)
    plan_s = time.perf_counter() - start
    victim = next(p.node for p in plan.placements if p.pool == "prefill")
    smaller = replace(topology, nodes=tuple(n for n in topology.nodes if n.name != victim))
    start = time.perf_counter()
    result = replan(plan, smaller, previous=topology)
    replan_s = time.perf_counter() - start
    return {"gpus": topology.gpu_count, "replicas": sum(p.replicas for p in POOLS), "plan_s": round(plan_s, 3),
            "replan_s": round(replan_s, 4), "policy": policy, "placed": len(plan.placements),
            "moved_on_replan": len(result.moves), "failed_node": victim}


def main(fmt: str, policy: str) -> int:
    figures = run(policy)
    if fmt == "json":
        print(json.dumps({k: figures[k] for k in ("gpus", "replicas", "plan_s", "replan_s")}))
    else:
        print(f"{figures['policy']}: {figures['gpus']} GPUs, {figures['replicas']} replicas "
              f"({figures['placed']} placed): plan {figures['plan_s']} s; node {figures['failed_node']} fails: "
              f"re-plan {figures['replan_s']} s, {figures['moved_on_replan']} replicas moved")
    return 0
