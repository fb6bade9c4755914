"""The kv-cache-scorer with `peer_pull`: a prefix a busier peer holds counts for a replica that
could pull it over the topology's paths faster than it would compute it, discounted by the
pull's price (`router.plugins.pull`). What a user sets it for: a hot prefix on a busy replica is
served by an idle NVLink-island neighbour, a replica across the network is worth less, and where
no holder is backed up the scorer decides as without it."""

from __future__ import annotations

import random

import pytest

from router.config import ProfileConfig
from router.decision import decide
from router.plugins.model import Candidate, ReplicaLoad, RouteRequest
from router.plugins.pull import best_pull
from router.plugins.scorers import RUNNING_WEIGHT, KvCacheScorer
from tests.conftest import ROOT
from tests.router.conftest import cand, req
from topology import Topology, read_source

pytestmark = pytest.mark.unit

TOPOLOGY = read_source(str(ROOT / "configs" / "clusters" / "local-sim.yaml"))
NODES = [n.name for n in TOPOLOGY.nodes]
BUSY = ReplicaLoad(running=40, waiting=6, inflight=46)
DOC = 16_384


def _cand(rid: str, node: str, gpu: int, load: ReplicaLoad | None = None) -> Candidate:
    return cand(rid, load=load, node=node, gpus=(gpu,), catalog_model="llama-3.1-8b", gpu_model="h100-sxm", tp=1)


def _cands(holder_load: ReplicaLoad = BUSY) -> list[Candidate]:
    return [_cand("holder", NODES[0], 0, holder_load), _cand("island", NODES[0], 1), _cand("far", NODES[1], 0)]


def _req(topology: Topology | None = TOPOLOGY) -> RouteRequest:
    return req(tokens=DOC + 100)._replace(cacheable_tokens=DOC + 96, cached={"holder": DOC}, topology=topology)


def test_an_idle_island_neighbour_pulls_the_busy_holders_prefix_and_wins() -> None:
    cands = _cands()
    r = _req()
    near, far = best_pull(r, cands[1], cands, RUNNING_WEIGHT), best_pull(r, cands[2], cands, RUNNING_WEIGHT)
    assert near is not None and far is not None and near.source == far.source == "holder"
    assert near.tokens == DOC and near.ms < far.ms < near.saved_ms  # NVLink beats the network; both beat computing
    pulling = KvCacheScorer(0.5, peer_pull=True).scores(r, cands)
    plain = KvCacheScorer(0.5).scores(r, cands)
    assert plain == [pytest.approx(DOC / (DOC + 96)), 0.0, 0.0]
    assert pulling[0] == plain[0] and pulling[0] > pulling[1] > pulling[2] > 0.5
    profile = ProfileConfig.model_validate({"scorers": {"kv-cache-scorer": {"weight": 1.0, "parameters":
                                                                            {"peer_pull": True}},
                                                        "queue-depth-scorer": 1.0}}).to_profile()
    assert decide(r, cands, profile, random.Random(0)).winner.endpoint.replica_id == "island"  # type: ignore[union-attr]
    plain_profile = ProfileConfig.model_validate({"scorers": {"kv-cache-scorer": 1.0,
                                                              "queue-depth-scorer": 1.0}}).to_profile()
    assert decide(r, cands, plain_profile, random.Random(0)).winner.endpoint.replica_id == "holder"  # type: ignore[union-attr]


def test_a_holder_that_is_not_backed_up_keeps_its_prefix() -> None:
    cands = _cands(ReplicaLoad(running=3, inflight=3))
    r = _req()
    assert best_pull(r, cands[1], cands, RUNNING_WEIGHT) is None
    assert KvCacheScorer(0.5, peer_pull=True).scores(r, cands) == KvCacheScorer(0.5).scores(r, cands)


def test_without_a_topology_pulls_are_priced_over_the_named_fallback_paths() -> None:
    cands = _cands()
    r = _req(None)
    near, far = best_pull(r, cands[1], cands, RUNNING_WEIGHT), best_pull(r, cands[2], cands, RUNNING_WEIGHT)
    assert near is not None and far is not None and near.ms < far.ms


def test_peer_pull_is_a_checked_parameter() -> None:
    with pytest.raises(ValueError, match="peer_pull: must be true or false"):
        ProfileConfig.model_validate({"scorers": {"kv-cache-scorer": {"weight": 1.0, "parameters":
                                                                      {"peer_pull": "on"}}}})
