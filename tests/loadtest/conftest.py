"""The load test's test kit: the shipped scenarios, and a scenario cut short (the same pools,
plan and traffic shape over fewer seconds: what a test can afford to simulate)."""

from __future__ import annotations

from dataclasses import replace

from loadtest.scenario import Scenario, load_scenario
from tests.conftest import ROOT

SCENARIOS = ROOT / "configs" / "scenarios"


def shortened(name: str, duration_s: float) -> Scenario:
    """configs/scenarios/<name>.yaml with its workload cut to `duration_s` seconds."""
    scenario = load_scenario(SCENARIOS / f"{name}.yaml")
    short = {**scenario.config.workload, "duration_s": duration_s}
    return replace(scenario, config=scenario.config.model_copy(update={"workload": short}))
