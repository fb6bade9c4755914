"""Seeded simulation regression: PD or an idle mixed replica by predicted TTFT
(router/plugins/pd.py) against splitting every long prompt, on test_sim.py's pools (one
prefill, one decode, two mixed replicas of llama-3.1-8b at TP=2) — the simulator runs the
router's own decision."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from loadtest.model import RequestResult, TraceRequest
from loadtest.sim.cluster import simulate
from loadtest.sim.model import PDChoice, SimConfig
from router.plugins.model import Candidate, RouteRequest
from router.plugins.pd import PDDecision, pd_decide
from tests.loadtest.conftest import config, workload
from topology import Topology

pytestmark = pytest.mark.sim


class _AlwaysSplit(PDChoice):
    """The old rule: every prompt over the threshold goes PD, whatever the load."""

    def __call__(self, req: RouteRequest, snapshot: Sequence[Candidate], topology: Topology | None, *,
                 min_prompt_tokens: int, has_mixed: bool) -> PDDecision | None:
        if req.prompt_tokens < min_prompt_tokens:
            return None
        return pd_decide(req, snapshot, topology, min_prompt_tokens=0, has_mixed=False)


def _split(c: SimConfig) -> SimConfig:
    return replace(c, pd_choice=_AlwaysSplit())


def _p99_ttft(results: list[RequestResult]) -> float:
    ttfts = sorted(r.ttft_s for r in results if r.ttft_s is not None)
    return ttfts[int(len(ttfts) * 0.99)]


def _burst(n: int, tokens: int) -> list[TraceRequest]:
    """`n` long prompts arriving together (a document batch), short answers."""
    return [TraceRequest(index=i, arrival_s=0.001 * i, prompt_tokens=tokens, output_tokens=8,
                         slo_class="standard") for i in range(n)]


def test_idle_mixed_replicas_take_long_prompts_from_a_queueing_prefill() -> None:
    burst = _burst(12, 8000)
    aware = simulate(config(), burst).results
    split = simulate(_split(config()), burst).results
    assert all(r.ok for r in aware) and all(r.ok for r in split)
    whole = [r for r in aware if not r.prefill_replica]
    assert whole and all(r.replica.startswith("mixed") for r in whole)  # the idle ones took some
    assert len(whole) < len(aware) / 2  # ... and only while idle: the pair serves the rest
    assert max(r.ttft_s or 0 for r in aware) < 0.9 * max(r.ttft_s or 0 for r in split)


def test_under_steady_load_the_pair_keeps_every_long_prompt() -> None:
    """At 60 req/s the mixed replicas are never idle: the choice is the old split, to the request."""
    busy, quiet = workload(400, rate=60.0), workload(300, rate=5.0)
    aware, calm = simulate(config(), busy).results, simulate(config(), quiet).results
    split = simulate(_split(config()), busy).results
    assert all(r.ok for r in aware) and all(r.ok for r in split)
    assert _p99_ttft(aware) <= _p99_ttft(split) * 1.01
    long = [r for r in calm if r.prompt_tokens >= 256]
    assert sum(1 for r in long if r.prefill_replica) > 0.8 * len(long)  # quiet: long prompts still split
