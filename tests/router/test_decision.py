"""Every routing plugin as a pure function of a snapshot."""

from __future__ import annotations

import random

import pytest

from pools.routing import ReplicaEndpoint
from router.decision import decide
from router.plugins.model import Candidate, ReplicaLoad, RouteRequest
from router.plugins.pd import pd_decide, pd_pair
from router.plugins.profile import Profile, check_profile
from tests.router.conftest import BATCH, INTERACTIVE, cand, req
from topology import read_source

pytestmark = pytest.mark.unit



def winner(cands: list[Candidate], profile: Profile, r: RouteRequest | None = None, seed: int = 0) -> str:
    d = decide(r or req(), cands, profile, random.Random(seed))
    assert d.winner is not None, d.reason
    return d.winner.endpoint.replica_id


def only(scorer: str) -> Profile:
    return Profile(scorers={scorer: 1.0})


def test_filters() -> None:
    cands = [cand("pre", role="prefill"), cand("sick", healthy=False),
             cand("open", load=ReplicaLoad(breaker_open=True)), cand("drain", draining=True), cand("ok")]
    assert winner(cands, Profile()) == "ok"
    d = decide(req(), [cand("pre", role="prefill")], Profile(), random.Random(0))
    assert d.winner is None and "role-filter" in d.reason
    # draining replicas still take sheddable traffic
    assert winner([cand("drain", draining=True)], Profile(), req(BATCH)) == "drain"
    assert decide(req(INTERACTIVE), [cand("drain", draining=True)], Profile(), random.Random(0)).winner is None


@pytest.mark.parametrize(("scorer", "better", "worse"), [
    ("queue-depth-scorer", ReplicaLoad(waiting=0, running=2), ReplicaLoad(waiting=5, running=2)),
    ("kv-usage-scorer", ReplicaLoad(kv_usage=0.1), ReplicaLoad(kv_usage=0.9)),
    ("link-health-scorer", ReplicaLoad(latency_ms=10), ReplicaLoad(latency_ms=900)),
])
def test_load_scorers(scorer: str, better: ReplicaLoad, worse: ReplicaLoad) -> None:
    assert winner([cand("worse", load=worse), cand("better", load=better)], only(scorer)) == "better"


def test_topology_scorers() -> None:
    assert winner([cand("pcie", tier="pcie"), cand("nv", tier="nvlink")], only("link-tier-scorer")) == "nv"
    sick = cand("sick", health_score=0.2)
    assert winner([sick, cand("fine")], only("link-health-scorer")) == "fine"


def test_prefix_affinity_is_sticky_and_spreads() -> None:
    cands = [cand(f"r{i}") for i in range(4)]
    picks = {winner(cands, only("prefix-affinity-scorer"), req(prefix=p)) for p in range(1, 200)}
    assert len(picks) == 4  # different prefixes spread over replicas
    same = {winner(cands, only("prefix-affinity-scorer"), req(prefix=42), seed=s) for s in range(10)}
    assert len(same) == 1  # the same prefix always prefers the same replica


def test_pickers_and_determinism() -> None:
    cands = [cand(f"r{i}") for i in range(3)]
    rr = Profile(picker="round-robin-picker")
    assert [decide(req(), cands, rr, random.Random(0), turn=t).winner.endpoint.replica_id  # type: ignore[union-attr]
            for t in range(4)] == ["r0", "r1", "r2", "r0"]
    rnd = Profile(picker="random-picker")
    a = [winner(cands, rnd, seed=s) for s in range(8)]
    assert a == [winner(cands, rnd, seed=s) for s in range(8)] and len(set(a)) > 1


def test_decisions_explain_themselves() -> None:
    d = decide(req(), [cand("a", load=ReplicaLoad(waiting=1)), cand("b")],
               Profile(scorers={"queue-depth-scorer": 2.0, "kv-usage-scorer": 1.0}), random.Random(0))
    assert [r.replica_id for r in d.ranked] == ["b", "a"]
    assert set(d.ranked[0].scores) == {"queue-depth-scorer", "kv-usage-scorer"}
    assert d.ranked[0].total == pytest.approx(2 * d.ranked[0].scores["queue-depth-scorer"] + 1.0)
    assert d.log_line().startswith("route -> b")
    with pytest.raises(ValueError, match="unknown routing plugins"):
        check_profile(Profile(scorers={"vibes-scorer": 1.0}))


def test_pd_pair_prefers_the_same_island_unless_it_is_backed_up() -> None:
    topo = read_source("configs/clusters/local-sim.yaml")
    kw: dict[str, object] = {"catalog_model": "llama-3.1-70b", "gpu_model": "h100-sxm", "tp": 4}
    prefill = cand("p", "prefill", None, node="h100-0", gpus=(0, 1, 2, 3), **kw)
    near = cand("near", "decode", None, node="h100-0", gpus=(4, 5, 6, 7), **kw)
    far = cand("far", "decode", None, node="h100-1", gpus=(0, 1, 2, 3), **kw)
    choice = pd_pair(req(INTERACTIVE, tokens=8000), [prefill], [far, near], topo)
    assert choice is not None and choice.decode.endpoint.replica_id == "near" and choice.tier == "nvlink"
    assert choice.tiers["far"] == "rdma" and [c.endpoint.replica_id for c in choice.decode_order] == ["near", "far"]
    busy = near._replace(load=ReplicaLoad(waiting=50))
    choice = pd_pair(req(INTERACTIVE, tokens=8000), [prefill], [far, busy], topo)
    assert choice is not None and choice.decode.endpoint.replica_id == "far"
    print(f"predicted TTFT via far decode {choice.predicted_ttft_ms:.1f} ms, KV {choice.kv_ms:.2f} ms over rdma")


def test_pd_decide_splits_long_prompts_and_falls_back_to_mixed() -> None:
    pre, dec = cand("pre", role="prefill"), cand("dec", role="decode")
    table = [cand("mix"), pre, dec]

    def pair(r: RouteRequest, snapshot: list[Candidate], has_mixed: bool = True) -> tuple[str, str] | None:
        pd = pd_decide(r, snapshot, None, min_prompt_tokens=256, has_mixed=has_mixed)
        return None if pd is None else (pd.prefill.endpoint.replica_id, pd.decode.endpoint.replica_id)

    assert pair(req(tokens=1000), table) == ("pre", "dec")
    assert pair(req(tokens=100), table) is None  # short: whole to a mixed replica
    assert pair(req(tokens=100), [pre, dec], has_mixed=False) == ("pre", "dec")  # PD-only: every prompt split
    sick = cand("dec", role="decode", healthy=False)
    assert pair(req(tokens=1000), [cand("mix"), pre, sick]) is None  # no healthy pair
    tripped = cand("dec", role="decode", load=ReplicaLoad(breaker_open=True))
    assert pair(req(tokens=1000), [pre, tripped]) is None
    draining = cand("dec", role="decode", draining=True)
    assert pair(req(INTERACTIVE, tokens=1000), [pre, draining]) is None
    assert pair(req(BATCH, tokens=1000), [pre, draining]) == ("pre", "dec")  # sheddable traffic may still use it
    other = Candidate(endpoint=ReplicaEndpoint(replica_id="x", url="http://127.0.0.1:1/x", model="other", pool="p",
                                               role="decode"), load=ReplicaLoad())
    assert pair(req(tokens=1000), [pre, other]) is None  # another model's decode does not count
