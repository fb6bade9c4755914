"""Seeded simulation: a PD pair's KV transport faults on the scenario timeline (issue 34): TCP
fallback and a remote NIC slow the pair's transfers by what the cost model says
(`physics.kvpath`), so its TTFT pays; restored, it does not."""

from __future__ import annotations

from dataclasses import replace

import pytest

from loadtest.compare import run_one, workload_for
from loadtest.model import TraceRequest
from loadtest.sim.cluster import simulate
from loadtest.sim.model import Fault
from physics import catalog, kvtransfer
from physics.kvpath import KvPathFault
from pools.model import PoolSpec
from tests.loadtest.conftest import TOPOLOGY, config, shortened
from topology import GpuRef, Path, path

pytestmark = pytest.mark.sim
POOLS = (PoolSpec(name="prefill", role="prefill", tp=2, replicas=1, model="llama-3.1-8b"),
         PoolSpec(name="decode", role="decode", tp=2, replicas=1, model="llama-3.1-8b"))
TOKENS = 8000


def _one(at_s: float = 0.0) -> list[TraceRequest]:
    return [TraceRequest(index=0, arrival_s=at_s, prompt_tokens=TOKENS, output_tokens=4, slo_class="standard")]


def _pair_and_paths() -> tuple[tuple[str, str], list[Path]]:
    c = config(pools=POOLS)
    p, d = (next(x for x in c.plan.placements if x.role == role) for role in ("prefill", "decode"))
    paths = [path(TOPOLOGY, GpuRef(p.node, a), GpuRef(d.node, b)) for a, b in zip(p.gpus, d.gpus, strict=True)]
    return (p.replica_id, d.replica_id), paths


def _ttft(faults: tuple[Fault, ...]) -> float:
    (r,) = simulate(config(pools=POOLS, faults=faults), _one(1.0)).results
    assert r.ok and r.ttft_s is not None and r.prefill_replica
    return r.ttft_s


@pytest.mark.parametrize(("kind", "fault"), [("kv_transport_fallback", KvPathFault(transport="tcp")),
                                             ("kv_remote_nic", KvPathFault(bandwidth_factor=0.5))])
def test_a_pair_fault_costs_what_the_cost_model_says(kind: str, fault: KvPathFault) -> None:
    pair, paths = _pair_and_paths()
    model = catalog.model("llama-3.1-8b")
    extra_ms = fault.handover_ms(model, TOKENS, paths) - kvtransfer.kv_handover_ms(model, TOKENS, paths)
    base = _ttft(())
    slow = _ttft((Fault(at_s=0.5, kind=kind, pair=pair, factor=0.5),))
    print(f"{kind}: TTFT {base * 1000:.2f} -> {slow * 1000:.2f} ms (cost model: +{extra_ms:.2f} ms)")
    assert (slow - base) * 1000 == pytest.approx(extra_ms, rel=0.02)
    restored = _ttft((Fault(at_s=0.2, kind=kind, pair=pair, factor=0.5), Fault(at_s=0.5, kind="kv_restore", pair=pair)))
    assert restored == pytest.approx(base, rel=1e-9)


def test_a_pair_fault_must_name_the_plans_replicas() -> None:
    with pytest.raises(ValueError, match="not two replicas"):
        simulate(config(pools=POOLS, faults=(Fault(at_s=0.0, kind="kv_remote_nic", pair=("x", "y")),)), _one())


def test_the_kv_fallback_scenario_shows_the_ttft_cost_of_a_bad_pair() -> None:
    scenario = shortened("kv-fallback", 120)
    workload = workload_for(scenario, 0.5)
    faulty = run_one(scenario, "island-aligned", 0.5, workload)
    clean = run_one(replace(scenario, config=scenario.config.model_copy(update={"faults": []})), "island-aligned",
                    0.5, workload)
    bad, good = faulty["summary"]["ttft_ms"], clean["summary"]["ttft_ms"]
    print(f"kv-fallback at 0.5x: TTFT mean {good['mean']:.0f} -> {bad['mean']:.0f} ms, "
          f"p99 {good['p99']:.0f} -> {bad['p99']:.0f} ms")
    assert bad["mean"] > 1.05 * good["mean"] and bad["p99"] > good["p99"]
