"""Seeded simulation regression: PD or mixed by predicted TTFT (router/plugins/pd.py) against
splitting every long prompt, on test_sim.py's pools (one prefill, one decode, two mixed replicas
of llama-3.1-8b at TP=2) — the simulator runs the router's own decision."""

from __future__ import annotations

import pytest

from loadtest.model import RequestResult
from loadtest.sim import cluster
from loadtest.sim.cluster import simulate
from router.decision import Candidate, PDDecision, RouteRequest, pd_decide
from tests.unit.test_sim import config, workload
from topology import Topology

pytestmark = pytest.mark.sim


def _always_split(req: RouteRequest, snapshot: list[Candidate], topology: Topology | None, *,
                  min_prompt_tokens: int, has_mixed: bool) -> PDDecision | None:
    """The old rule: every prompt over the threshold goes PD, whatever the load."""
    if req.prompt_tokens < min_prompt_tokens:
        return None
    return pd_decide(req, snapshot, topology, min_prompt_tokens=0, has_mixed=False)


def _p99_ttft(results: list[RequestResult]) -> float:
    ttfts = sorted(r.ttft_s for r in results if r.ttft_s is not None)
    return ttfts[int(len(ttfts) * 0.99)]


def test_load_aware_pd_cuts_the_ttft_tail_and_still_splits_at_low_load(monkeypatch: pytest.MonkeyPatch) -> None:
    busy, quiet = workload(400, rate=60.0), workload(300, rate=5.0)
    aware, calm = simulate(config(), busy).results, simulate(config(), quiet).results
    monkeypatch.setattr(cluster, "pd_decide", _always_split)
    split = simulate(config(), busy).results
    assert all(r.ok for r in aware) and all(r.ok for r in split)
    assert _p99_ttft(aware) < 0.6 * _p99_ttft(split)
    long = [r for r in calm if r.prompt_tokens >= 256]
    assert sum(1 for r in long if r.prefill_replica) > 0.8 * len(long)  # quiet: long prompts still split
