"""Gangs in the simulator, the sizing search and the re-plan: an EP gang serves as one endpoint per
data-parallel rank, pays for its all-to-all over the links it was placed on, is sized per phase,
and moves as a unit when its domain splits."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from loadtest.model import TraceRequest
from loadtest.sim.cluster import simulate
from loadtest.sim.model import SimConfig
from pools.model import DEFAULT_SLO_CLASSES, PlacementRequest, PoolSpec
from pools.placement import place
from pools.placement.replan import replan
from pools.sizing import size
from topology import LinkHealth, Topology
from topology.readers.spec import parse_spec

pytestmark = pytest.mark.unit

MOE = "qwen3-30b-a3b"
CLASSES = {c.name: c for c in DEFAULT_SLO_CLASSES}
TWO_HGX = parse_spec("racks:\n  - name: r\n    nodes: [{name: h, template: hgx-h100, count: 2}]\n")
POOLS = (PoolSpec(name="small", role="mixed", tp=1, replicas=4, model="llama-3.1-8b"),
         PoolSpec(name="moe", role="mixed", tp=1, dp=8, expert_parallel=True, replicas=1, model=MOE))


def load(n: int = 400, rate: float = 40.0) -> list[TraceRequest]:
    rng, t, out = random.Random(3), 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        out.append(TraceRequest(index=i, arrival_s=t, prompt_tokens=rng.choice([200, 800]),
                                output_tokens=rng.randint(50, 150), slo_class="standard"))
    return out


def sim(policy: str, topology: Topology = TWO_HGX) -> tuple[list[str], float, str]:
    plan = place(PlacementRequest(topology=topology, pools=POOLS, slo_classes=CLASSES), policy)
    gang = next(p for p in plan.placements if p.pool == "moe")
    config = SimConfig(topology=topology, plan=plan, classes=CLASSES, model=MOE, pd_enabled=False)
    results = simulate(config, load()).results
    assert all(r.ok for r in results)
    tpots = sorted(r.tpot_s for r in results if r.tpot_s is not None)
    return [r.replica for r in results], tpots[len(tpots) // 2], gang.tier


def test_the_router_balances_every_dp_rank_of_the_gang() -> None:
    served, _, tier = sim("island-aligned")
    ranks = {rid for rid in served}
    assert ranks == {f"moe-0-dp{k}" for k in range(8)}
    counts = [served.count(r) for r in sorted(ranks)]
    assert min(counts) > 0.5 * max(counts)
    assert tier == "nvlink"


def _deepseek_tpot(topology: Topology) -> tuple[float, str]:
    pools = (PoolSpec(name="moe", role="mixed", tp=1, dp=16, expert_parallel=True, replicas=1, model="deepseek-v3"),)
    plan = place(PlacementRequest(topology=topology, pools=pools, slo_classes=CLASSES), "island-aligned")
    config = SimConfig(topology=topology, plan=plan, classes=CLASSES, model="deepseek-v3", pd_enabled=False)
    results = simulate(config, load(n=2000, rate=350.0)).results
    assert all(r.ok for r in results)
    tpots = sorted(r.tpot_s for r in results if r.tpot_s is not None)
    return tpots[len(tpots) // 2], plan.placements[0].tier


def test_the_same_gang_decodes_slower_when_its_all_to_all_leaves_the_domain() -> None:
    """DeepSeek-V3 EP16 on sixteen GB200s: one NVLink domain of four trays, or four one-tray
    racks whose all-to-all crosses the spine every MoE layer."""
    one = parse_spec("racks:\n  - name: a\n    nodes: [{name: t, template: gb200-nvl72, count: 4}]\n")
    four = parse_spec("racks:\n" + "".join(f"  - name: r{k}\n    nodes: [{{name: t{k}, template: gb200-nvl72}}]\n"
                                            for k in range(4)))
    inside, tier_in = _deepseek_tpot(one)
    spread, tier_out = _deepseek_tpot(four)
    assert tier_in == "nvlink" and tier_out in ("rdma", "rack")
    assert spread > 1.2 * inside


def test_a_lost_node_takes_every_rank_of_a_gang_with_it() -> None:
    plan = place(PlacementRequest(topology=TWO_HGX, pools=POOLS, slo_classes=CLASSES), "first-fit")
    gang = next(p for p in plan.placements if p.pool == "moe")
    second = gang.members[-1].node
    from loadtest.sim.model import Fault
    config = SimConfig(topology=TWO_HGX, plan=plan, classes=CLASSES, model=MOE, pd_enabled=False,
                       faults=(Fault(at_s=2.0, kind="node_loss", node=second),))
    results = simulate(config, load(n=200)).results
    late = [r for r in results if r.sent_s > 3.0]
    assert late and all(not r.ok for r in late)  # every rank gone: nothing left to serve the model


def test_sizing_proposes_expert_parallel_gangs_per_phase() -> None:
    slos = [CLASSES["interactive"]]
    hgx = parse_spec("racks:\n  - name: r\n    nodes: [{name: h, template: hgx-h100, count: 8}]\n")
    proposal = size(hgx, "deepseek-v3", "azure-conv", slos)
    for phase in (proposal.prefill, proposal.decode):
        assert phase.expert_parallel and phase.gpus >= 16  # EP8 does not fit 80 GB: 99 GB of weights per GPU
    assert proposal.gpus <= 64
    fixed = size(hgx, "deepseek-v3", "azure-conv", slos, prefill_dp=32, decode_dp=16)
    assert (fixed.prefill.dp, fixed.decode.dp) == (32, 16)


def test_a_domain_that_splits_moves_its_ep_gang_as_one() -> None:
    plan = place(PlacementRequest(topology=TWO_HGX, pools=POOLS, slo_classes=CLASSES), "island-aligned")
    gang = next(p for p in plan.placements if p.pool == "moe")
    node = TWO_HGX.node(gang.node)
    sick = replace(node, links=tuple(replace(link, health=LinkHealth(score=0.1, healthy=False, reasons=("crc",)))
                                     if link.a == 0 else link for link in node.links))
    after = replace(TWO_HGX, nodes=tuple(sick if n.name == node.name else n for n in TWO_HGX.nodes))
    moved = replan(plan, after)
    assert [m.replica_id for m in moved.moves if m.replica_id.startswith("moe")] == ["moe-0"]
    again = next((p for p in moved.plan.placements if p.pool == "moe"), None)
    assert again is None or all(g != 0 or n != node.name for n, g in again.gpu_refs())
