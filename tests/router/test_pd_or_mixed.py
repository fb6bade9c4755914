"""PD or mixed by predicted TTFT, and the PD pair priced over the real links of both replicas
(the prefill's own TP group, the KV path between the two) on the local-sim cluster."""

from __future__ import annotations

from dataclasses import replace

import pytest

from physics import catalog, costmodel, kvtransfer
from pools.model import DEFAULT_SLO_CLASSES
from pools.routing import ReplicaEndpoint
from router.plugins import ttft
from router.plugins.model import Candidate, ReplicaLoad, RouteRequest
from router.plugins.pd import pd_decide, pd_pair, pd_route
from topology import GpuRef, bottleneck, path, read_source

pytestmark = pytest.mark.unit
INTERACTIVE, STANDARD, BATCH = DEFAULT_SLO_CLASSES
TOPOLOGY = read_source("configs/clusters/local-sim.yaml")
MIN = 256


def rep(rid: str, role: str, node: str, gpus: tuple[int, ...], load: ReplicaLoad | None = None,
        model: str | None = "llama-3.1-8b", **kw: object) -> Candidate:
    ep = ReplicaEndpoint(replica_id=rid, url=f"http://127.0.0.1:1/{rid}", model="m", pool=role, role=role,  # type: ignore[arg-type]
                         node=node, gpus=gpus, tp=len(gpus), catalog_model=model, gpu_model="h100-sxm",
                         **kw)  # type: ignore[arg-type]
    return Candidate(endpoint=ep, load=load or ReplicaLoad())


def req(tokens: int, slo: object = STANDARD) -> RouteRequest:
    return RouteRequest(model="m", slo_class=slo, prompt_tokens=tokens)  # type: ignore[arg-type]


PREFILL = rep("p", "prefill", "h100-0", (0, 1))
DECODE = rep("d", "decode", "h100-0", (2, 3))
MIXED = rep("mix", "mixed", "h100-1", (0, 1))


def split(r: RouteRequest, snapshot: list[Candidate], has_mixed: bool = True) -> bool:
    return pd_decide(r, snapshot, TOPOLOGY, min_prompt_tokens=MIN, has_mixed=has_mixed) is not None


def test_an_idle_mixed_replica_takes_a_long_prompt_from_a_backed_up_pair() -> None:
    busy = PREFILL._replace(load=ReplicaLoad(running=1, waiting=3, inflight=4))
    route = pd_route(req(4000), [MIXED, busy, DECODE], TOPOLOGY, min_prompt_tokens=MIN, has_mixed=True)
    assert route.decision is None and route.reason.startswith("idle mixed"), route.reason
    assert split(req(4000), [MIXED, PREFILL, DECODE])  # the same pair, idle, keeps it


def test_a_long_prompt_on_idle_replicas_still_goes_pd() -> None:
    for tokens in (MIN, 2000, 8000, 32000):
        route = pd_route(req(tokens), [MIXED, PREFILL, DECODE], TOPOLOGY, min_prompt_tokens=MIN, has_mixed=True)
        assert route.decision is not None, route.reason
        assert route.decision.mixed_ttft_ms is not None
        assert route.decision.ready_ms <= route.decision.mixed_ttft_ms
    # and a mixed replica busy decoding prefills slower still (its decodes share every chunk's step)
    decoding = MIXED._replace(load=ReplicaLoad(running=64, kv_usage=0.5, inflight=64))
    assert split(req(8000), [decoding, PREFILL, DECODE])


def test_a_busy_mixed_replica_never_takes_a_prompt_from_the_pair() -> None:
    """A mixed replica with anything running, waiting or in flight keeps its steps for what it
    has: a long prefill there would stall its decodes (TPOT) and the short prompts queued behind
    it (TTFT) — in the simulator that cost the chaos deployment 23 % of its capacity (172 -> 132
    req/s) when any faster mixed replica could take the prompt."""
    backed_up = PREFILL._replace(load=ReplicaLoad(running=1, waiting=3, inflight=4))
    for load in (ReplicaLoad(running=1, inflight=1), ReplicaLoad(waiting=1), ReplicaLoad(inflight=1)):
        assert split(req(4000), [MIXED._replace(load=load), backed_up, DECODE])


def test_short_prompts_never_split_while_pd_only_deployments_split_every_prompt() -> None:
    backed_up = MIXED._replace(load=ReplicaLoad(waiting=50, inflight=50))
    assert not split(req(MIN - 1), [backed_up, PREFILL, DECODE])  # under the threshold: never PD
    assert split(req(10), [PREFILL, DECODE], has_mixed=False)  # no mixed replica at all
    busy = PREFILL._replace(load=ReplicaLoad(waiting=20, inflight=20))
    assert split(req(10), [busy, DECODE], has_mixed=False)  # nothing to compare with: PD
    sick = MIXED._replace(endpoint=replace(MIXED.endpoint, healthy=False))
    assert split(req(4000), [sick, busy, DECODE])  # the only mixed replica is down


def test_the_prefill_is_priced_over_its_own_tp_links() -> None:
    degraded = rep("slow", "prefill", "h100-degraded", (2, 3))  # GPU3 trained down to 9 NVLink lanes
    link = ttft.hardware(degraded.endpoint, TOPOLOGY).link
    worst = bottleneck(TOPOLOGY, [GpuRef("h100-degraded", 2), GpuRef("h100-degraded", 3)])
    assert (link.bandwidth_gb_s, link.latency_us) == (worst.bandwidth_gb_s, worst.latency_us)
    assert link.bandwidth_gb_s < ttft.hardware(PREFILL.endpoint, TOPOLOGY).link.bandwidth_gb_s
    choice = pd_pair(req(8000), [degraded, PREFILL], [DECODE], TOPOLOGY)
    assert choice is not None and choice.prefill.endpoint.replica_id == "p"
    slow, fast = sorted(choice.ranked, key=lambda r: r[0] != "slow")
    assert slow[2] > fast[2]


def test_queues_and_decode_admission_come_from_load() -> None:
    idle = pd_pair(req(4000), [PREFILL], [DECODE], TOPOLOGY)
    queued = pd_pair(req(4000), [PREFILL._replace(load=ReplicaLoad(waiting=2, inflight=2))], [DECODE], TOPOLOGY)
    waiting = pd_pair(req(4000), [PREFILL], [DECODE._replace(load=ReplicaLoad(running=8, waiting=3))], TOPOLOGY)
    assert idle is not None and queued is not None and waiting is not None
    pre = ttft.prefill_ms(ttft.hardware(PREFILL.endpoint, TOPOLOGY), 4000)
    assert queued.predicted_ttft_ms - idle.predicted_ttft_ms == pytest.approx(2 * pre)
    step = ttft.decode_step_ms(ttft.hardware(DECODE.endpoint, TOPOLOGY), 9, 0.0, 4000)
    assert waiting.predicted_ttft_ms - idle.predicted_ttft_ms == pytest.approx(4 * step - idle.handover_ms + idle.kv_ms,
                                                                               rel=1e-6)


def test_the_kv_moves_rank_by_rank_over_the_paths_between_the_replicas() -> None:
    near = pd_pair(req(8000), [PREFILL], [DECODE], TOPOLOGY)
    far = pd_pair(req(8000), [PREFILL], [rep("far", "decode", "h100-1", (0, 1))], TOPOLOGY)
    assert near is not None and far is not None and (near.tier, far.tier) == ("nvlink", "rdma")
    assert far.kv_ms > 5 * near.kv_ms > 0
    paths = [path(TOPOLOGY, GpuRef("h100-0", a), GpuRef("h100-1", b)) for a, b in ((0, 0), (1, 1))]
    assert far.kv_ms == pytest.approx(kvtransfer.kv_handover_ms(catalog.model("llama-3.1-8b"), 8000, paths))


def test_without_a_topology_the_named_fallbacks_price_the_links() -> None:
    hw = ttft.hardware(PREFILL.endpoint, None)
    assert hw.link == costmodel.TP_LINK_FALLBACK
    unnamed = rep("u", "prefill", "", (), model=None)
    assert ttft.hardware(unnamed.endpoint, None).model.name == ttft.FALLBACK_MODEL
    same = pd_pair(req(4000), [PREFILL], [DECODE], None)
    cross = pd_pair(req(4000), [PREFILL], [rep("x", "decode", "elsewhere", (0, 1))], None)
    assert same is not None and cross is not None and (same.tier, cross.tier) == ("local", "rdma")
    assert 0 < same.kv_ms < cross.kv_ms


def test_a_rank_of_an_expert_parallel_gang_is_priced_as_its_share_of_the_experts() -> None:
    """DeepSeek-V3 on one H100 does not fit; one rank of an EP32 gang does. The router prices the
    rank's steps and cache as that rank (its 1/32 of the experts), so a decode rank with a smaller
    batch is the cheaper one, and the rank routed to is the less loaded."""
    lone = ttft.hardware(rep("whole", "decode", "h100-0", (0,), model="deepseek-v3").endpoint, TOPOLOGY)
    rank = ttft.hardware(rep("r", "decode", "h100-0", (0,), model="deepseek-v3", expert_parallel=32).endpoint,
                         TOPOLOGY)
    assert lone.kv_capacity_tokens == 1 and rank.kv_capacity_tokens > 100_000
    assert ttft.decode_step_ms(rank, 64, 0.0) < 0.25 * ttft.decode_step_ms(lone, 64, 0.0)
    assert ttft.decode_step_ms(rank, 1, 0.1) < ttft.decode_step_ms(rank, 64, 0.1)
    ranks = [rep(f"d{k}", "decode", "h100-0", (k,), ReplicaLoad(running=r, kv_usage=0.1), model="deepseek-v3",
                 expert_parallel=32, gang="g", dp_rank=k) for k, r in ((0, 60), (1, 4))]
    prefill = rep("p0", "prefill", "h100-1", (0,), model="deepseek-v3", expert_parallel=16, gang="pg")
    decision = pd_pair(req(2000), [prefill], ranks, TOPOLOGY)
    assert decision is not None and decision.decode.endpoint.replica_id == "d1"
    # TP=2 x DP=16: 16 ranks of two GPUs; a whole gang behind one endpoint reports its 16 ranks' load together
    tp2 = ttft.hardware(rep("t", "decode", "h100-0", (0, 1), model="deepseek-v3", expert_parallel=32,
                            gang="g2").endpoint, TOPOLOGY)
    whole = ttft.hardware(rep("w", "decode", "h100-0", (0, 1), model="deepseek-v3", expert_parallel=32).endpoint,
                          TOPOLOGY)
    assert (tp2.ep, tp2.load_ranks, whole.load_ranks) == (16, 1, 16)
    assert ttft.decode_step_ms(whole, 16 * 8, 0.1) == pytest.approx(ttft.decode_step_ms(tp2, 8, 0.1))


def test_the_prefill_leg_goes_where_the_prompt_is_cached() -> None:
    """Two alike prefill replicas, one holding the prompt's first 7,168 tokens (router.kvindex): the
    pair through it is predicted that much sooner; with a prompt as long queued ahead of it, the
    idle one wins (the cache saves less than the queue costs): cache and load in one prediction."""
    other = rep("p2", "prefill", "h100-0", (4, 5))
    cached = req(8000)._replace(cacheable_tokens=7984, cached={"p2": 7168})
    choice = pd_pair(cached, [PREFILL, other], [DECODE], TOPOLOGY)
    assert choice is not None and choice.prefill.endpoint.replica_id == "p2"
    busy = other._replace(load=ReplicaLoad(waiting=1))
    assert (found := pd_pair(cached, [PREFILL, busy], [DECODE], TOPOLOGY)) is not None
    assert found.prefill.endpoint.replica_id == "p"
    plain = pd_pair(req(8000), [PREFILL, other], [DECODE], TOPOLOGY)
    assert plain is not None and plain.predicted_ttft_ms > choice.predicted_ttft_ms
