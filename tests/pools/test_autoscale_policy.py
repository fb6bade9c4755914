"""The autoscaling policy on its own: load and SLO signals, delays and cooldown, bounds, and the
topology-aware choices of where to add and what to remove."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pools.autoscale.actions import Removable, removal_order, scale_out
from pools.autoscale.policy import (
    AutoscalerState,
    AutoscalingConfig,
    ClassLatency,
    PoolObservation,
    desired,
    learn,
    on_tick,
)
from pools.model import PlacementRequest, PoolSpec
from pools.placement import place
from topology import GpuRef
from topology.readers.spec import parse_spec

pytestmark = pytest.mark.unit

CFG = AutoscalingConfig(min_replicas=1, max_replicas=6, target_ongoing_requests=16, upscale_delay_s=5,
                        downscale_delay_s=30, cooldown_s=5)


def obs(replicas: int, running: float, waiting: float = 0.0, role: str = "decode", tpot: float | None = None,
        ttft: float | None = None, rate: float = 0.0, capacity: float | None = None,
        serving: int | None = None) -> PoolObservation:
    latency = ClassLatency(tpot_ms=tpot, tpot_target_ms=50.0, ttft_ms=ttft, ttft_target_ms=500.0)
    return PoolObservation(pool="decode", role=role, replicas=replicas, running=running, waiting=waiting,  # type: ignore[arg-type]
                           classes={"interactive": latency}, request_rate=rate, capacity_rps=capacity,
                           serving=serving)


def test_load_sets_the_count_as_ray_serve_does_within_bounds() -> None:
    assert desired(obs(2, 64), CFG)[0] == 4
    assert desired(obs(2, 400), CFG)[0] == 6  # max_replicas
    assert "capped at max_replicas" in desired(obs(2, 400), CFG)[1]
    assert desired(obs(4, 0), CFG)[0] == 1  # min_replicas


def test_slo_pressure_adds_a_replica_while_loaded_and_sizing_says_how_many() -> None:
    want, why = desired(obs(2, 20, tpot=49.0), CFG)
    assert want == 3 and "TPOT p95" in why
    assert desired(obs(2, 20, tpot=60.0, rate=10.0, capacity=2.0), CFG)[0] == 5
    assert desired(obs(2, 20, role="prefill", ttft=480.0), CFG)[0] == 3
    # a late p99 on an idle pool (one long prompt's prefill) is not something replicas fix: it does
    # not grow the pool (the load alone says one replica will do)
    assert desired(obs(2, 4, role="prefill", ttft=900.0), CFG)[0] == 1


def test_no_shrinking_under_a_queue_or_near_the_targets() -> None:
    assert desired(obs(4, 5, waiting=10), CFG)[0] == 4
    assert desired(obs(4, 40, tpot=40.0), CFG)[0] == 4  # loaded and near its target
    assert desired(obs(4, 5, tpot=40.0), CFG)[0] == 1  # idle: that latency is not the load's
    assert desired(obs(4, 5, tpot=10.0), CFG)[0] == 1


def test_delays_and_cooldown() -> None:
    state = AutoscalerState()
    actions, state = on_tick(0.0, {"decode": obs(2, 64)}, {"decode": CFG}, state)
    assert actions == []  # wanted since t=0, upscale delay 5 s
    actions, state = on_tick(4.0, {"decode": obs(2, 64)}, {"decode": CFG}, state)
    assert actions == []
    actions, state = on_tick(5.0, {"decode": obs(2, 64)}, {"decode": CFG}, state)
    assert [(a.delta, a.target) for a in actions] == [(2, 4)] and actions[0].reason.startswith("scale out 2 -> 4")
    actions, state = on_tick(6.0, {"decode": obs(4, 200)}, {"decode": CFG}, state)
    assert actions == []  # cooldown (and a fresh delay)
    actions, state = on_tick(20.0, {"decode": obs(4, 0)}, {"decode": CFG}, state)
    actions, state = on_tick(45.0, {"decode": obs(4, 0)}, {"decode": CFG}, state)
    assert actions == []  # down: 30 s delay from t=20
    actions, state = on_tick(50.0, {"decode": obs(4, 0)}, {"decode": CFG}, state)
    assert [a.target for a in actions] == [1]
    assert on_tick(60.0, {"other": obs(1, 500)}, {"decode": CFG}, state)[0] == []  # no config: left alone


def test_bad_config_is_one_error() -> None:
    with pytest.raises(ValueError, match=r"min_replicas .* max_replicas"):
        AutoscalingConfig(min_replicas=3, max_replicas=2)


def test_scale_in_takes_the_worst_tier_and_sickest_links_first() -> None:
    order = removal_order([Removable(replica_id="a", tier="nvlink", inflight=1),
                           Removable(replica_id="b", tier="pcie", inflight=9),
                           Removable(replica_id="c", tier="nvlink", health_score=0.4, inflight=5),
                           Removable(replica_id="d", tier="nvlink", draining=True, inflight=30)])
    assert order == ["d", "b", "c", "a"]


def test_scale_out_places_new_replicas_on_free_gpus_inside_islands() -> None:
    """Two HGX nodes holding two TP=4 decodes: two more go inside islands on the GPUs nobody holds,
    with the next free ids; asking for more than fits says how many could not be placed."""
    topo = parse_spec("racks:\n  - name: r\n    nodes: [{name: h, template: hgx-h100, count: 2}]\n")
    pool = PoolSpec(name="decode", role="decode", tp=4, replicas=2, model="llama-3.1-70b")
    plan = place(PlacementRequest(topology=topo, pools=(pool,)), "island-aligned")
    ours, left = scale_out(plan, topo, "decode", 2, "island-aligned")
    assert left == 0 and [p.replica_id for p in ours] == ["decode-2", "decode-3"]
    assert all(p.in_island for p in ours)
    taken = {(n, g) for p in plan.placements for n, g in p.gpu_refs()}
    assert not taken & {(n, g) for p in ours for n, g in p.gpu_refs()}
    _, none_left = scale_out(plan, topo, "decode", 9, "island-aligned")
    assert none_left == 7


def test_the_sizing_prediction_leads_the_load_rule_and_holds_the_floor() -> None:
    """A step in the arrival rate shows before a queue: the prediction scales out at once; and a
    pool whose in-flight count looks small keeps what its rate needs."""
    want, why = desired(obs(2, 10, rate=9.0, capacity=1.5), CFG)
    assert want == 6 and "9 req/s needs 6 at 1.5 req/s each" in why
    assert desired(obs(5, 10, rate=6.0, capacity=1.5), CFG)[0] == 4  # load alone would say 1
    assert desired(obs(5, 10, rate=6.0), CFG)[0] == 1  # no capacity: no prediction


def test_a_missed_target_bounds_the_capacity_and_the_bound_relaxes() -> None:
    """A loaded pool late at 1.2 req/s per replica: one replica carries no more than that; the
    bound relaxes back towards the model (doubling every 300 s); not learnt while a replica starts."""
    late = obs(3, 40, tpot=48.0, rate=3.6, capacity=2.0)
    assert learn(late, CFG, None, 5.0) == pytest.approx(1.2)
    assert learn(late, CFG, 1.0, 5.0) == pytest.approx(1.0)
    calm = obs(3, 40, tpot=30.0, rate=3.6, capacity=2.0)
    assert learn(calm, CFG, 1.0, 300.0) is None  # back at the model's 2.0: no bound
    assert learn(calm, CFG, 0.5, 300.0) == pytest.approx(1.0)
    assert learn(obs(3, 40, tpot=48.0, rate=3.6, capacity=2.0, serving=2), CFG, None, 5.0) is None
    _, state = on_tick(0.0, {"decode": late}, {"decode": CFG}, AutoscalerState())
    assert state.pools["decode"].capacity_bound_rps == pytest.approx(1.2)
    want, why = desired(obs(3, 20, rate=3.6, capacity=2.0), CFG, state.pools["decode"].capacity_bound_rps)
    assert want == 3 and "as the pool's latency showed" in why


def test_scale_in_takes_the_most_any_tick_of_the_delay_wanted() -> None:
    """Kubernetes HPA's stabilization window: a lull at the end of the delay does not decide."""
    state = AutoscalerState()
    for t, running in ((0.0, 48.0), (10.0, 64.0), (20.0, 16.0), (30.0, 16.0)):
        actions, state = on_tick(t, {"decode": obs(6, running)}, {"decode": CFG}, state)
    assert [(a.delta, a.target) for a in actions] == [(-2, 4)]


def test_a_new_prefill_goes_next_to_the_decode_pool_not_to_the_tightest_island() -> None:
    """Node h-0 holds the decodes (six of its eight NVSwitch GPUs free); node h-1 has two GPUs left
    after other work. Best fit alone would take h-1's last pair; the KV path says h-0, where the
    cache crosses NVLink. The topology-blind first-fit is left as it is."""
    topo = parse_spec("racks:\n  - name: r\n    nodes: [{name: h, template: hgx-h100, count: 2}]\n")
    pools = (PoolSpec(name="prefill", role="prefill", tp=2, replicas=0, model="llama-3.1-8b"),
             PoolSpec(name="decode", role="decode", tp=2, replicas=1, model="llama-3.1-8b"))
    held = frozenset(GpuRef("h-1", g) for g in range(6))
    plan = place(PlacementRequest(topology=topo, pools=pools, occupied=held | {GpuRef("h-1", 6), GpuRef("h-1", 7)}),
                 "island-aligned")  # the decode went to h-0 while h-1 was full; then two of h-1's GPUs came free
    assert [(p.pool, p.node) for p in plan.placements] == [("decode", "h-0")]
    alone = place(PlacementRequest(topology=topo, pools=(replace(pools[0], replicas=1),),
                                   occupied=held | {GpuRef("h-0", g) for g in plan.placements[0].gpus}),
                  "island-aligned")
    assert alone.placements[0].node == "h-1"  # best fit, without the partner in view
    ours, left = scale_out(plan, topo, "prefill", 1, "island-aligned", held)
    assert left == 0 and ours[0].node == "h-0" and ours[0].replica_id == "prefill-0"
    blind, _ = scale_out(plan, topo, "prefill", 1, "first-fit", held)
    assert blind[0].node == "h-0"  # first-fit takes the lowest free GPUs (here h-0 too), not by the KV path
    grown, _ = scale_out(plan, topo, "prefill", 4, "island-aligned", held)
    assert [p.node for p in grown] == ["h-0", "h-0", "h-0", "h-1"]  # then elsewhere


def test_no_more_replicas_for_a_late_tail_while_one_is_still_starting() -> None:
    """A vLLM server loading for minutes: asking again every cooldown would send the pool to
    max_replicas; the load and prediction rules still apply."""
    assert desired(obs(3, 40, tpot=60.0, serving=2), CFG)[0] == 3
    assert desired(obs(3, 40, tpot=60.0, serving=3), CFG)[0] == 4
    assert desired(obs(3, 80, tpot=60.0, serving=2), CFG)[0] == 5  # the load rule is not held back


def test_a_scale_in_the_count_already_made_is_no_action() -> None:
    """A node loss took the pool from 4 to 3 while 3 was wanted: nothing is left to remove."""
    state = AutoscalerState()
    _, state = on_tick(0.0, {"decode": obs(4, 40)}, {"decode": CFG}, state)  # 3 wanted
    actions, state = on_tick(40.0, {"decode": obs(3, 16)}, {"decode": CFG}, state)
    assert actions == []


def test_a_pool_cannot_scale_to_zero() -> None:
    with pytest.raises(ValueError, match="min_replicas"):
        AutoscalingConfig(min_replicas=0, max_replicas=2)
