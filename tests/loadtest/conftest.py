"""The load test's test kit: the shipped scenarios, a scenario cut short (the same pools, plan and
traffic shape over fewer seconds: what a test can afford to simulate), and the small simulated
deployment the simulator's tests share (`config`, `workload`)."""

from __future__ import annotations

import random
from dataclasses import replace

from loadtest.model import TraceRequest
from loadtest.scenario import Scenario, load_scenario
from loadtest.sim.model import SimConfig
from pools.model import DEFAULT_SLO_CLASSES, PlacementRequest, PoolSpec
from pools.placement import get_policy
from tests.conftest import ROOT
from topology import read_source

SCENARIOS = ROOT / "configs" / "scenarios"


def shortened(name: str, duration_s: float) -> Scenario:
    """configs/scenarios/<name>.yaml with its workload cut to `duration_s` seconds."""
    scenario = load_scenario(SCENARIOS / f"{name}.yaml")
    short = {**scenario.config.workload, "duration_s": duration_s}
    return replace(scenario, config=scenario.config.model_copy(update={"workload": short}))


CLASSES = {c.name: c for c in DEFAULT_SLO_CLASSES}
TOPOLOGY = read_source(str(ROOT / "configs/clusters/local-sim.yaml"))
POOLS = (PoolSpec(name="prefill", role="prefill", tp=2, replicas=1, model="llama-3.1-8b"),
         PoolSpec(name="decode", role="decode", tp=2, replicas=1, model="llama-3.1-8b"),
         PoolSpec(name="mixed", role="mixed", tp=2, replicas=2, model="llama-3.1-8b"))


def workload(n: int = 300, rate: float = 10.0, seed: int = 1) -> list[TraceRequest]:
    rng, t, out = random.Random(seed), 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        out.append(TraceRequest(index=i, arrival_s=t, prompt_tokens=rng.choice([80, 400, 2000]),
                                output_tokens=rng.randint(5, 200), slo_class=rng.choice(list(CLASSES))))
    return out


def config(policy: str = "island-aligned", pools: tuple[PoolSpec, ...] = POOLS, **kw: object) -> SimConfig:
    plan = get_policy(policy).place(PlacementRequest(topology=TOPOLOGY, pools=pools, slo_classes=CLASSES))
    return replace(SimConfig(topology=TOPOLOGY, plan=plan, classes=CLASSES), **kw)  # type: ignore[arg-type]
