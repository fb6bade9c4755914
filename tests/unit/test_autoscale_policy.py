"""The autoscaling policy on its own: load and SLO signals, delays and cooldown, bounds, and the
topology-aware choices of where to add and what to remove."""

from __future__ import annotations

import pytest

from pools.autoscale.actions import Removable, removal_order, scale_out
from pools.autoscale.policy import AutoscalerState, AutoscalingConfig, PoolObservation, desired, on_tick
from pools.model import PlacementRequest, PoolSpec
from pools.placement import place
from topology.readers.spec import parse_spec

pytestmark = pytest.mark.unit

CFG = AutoscalingConfig(min_replicas=1, max_replicas=6, target_ongoing_requests=16, upscale_delay_s=5,
                        downscale_delay_s=30, cooldown_s=5)


def obs(replicas: int, running: float, waiting: float = 0.0, role: str = "decode", tpot: float | None = None,
        ttft: float | None = None, predicted: int | None = None) -> PoolObservation:
    return PoolObservation(pool="decode", role=role, replicas=replicas, running=running, waiting=waiting,  # type: ignore[arg-type]
                           tpot_p99_ms=tpot, tpot_target_ms=50.0, ttft_p99_ms=ttft, ttft_target_ms=500.0,
                           predicted_replicas=predicted)


def test_load_sets_the_count_as_ray_serve_does_within_bounds() -> None:
    assert desired(obs(2, 64), CFG)[0] == 4
    assert desired(obs(2, 400), CFG)[0] == 6  # max_replicas
    assert "capped at max_replicas" in desired(obs(2, 400), CFG)[1]
    assert desired(obs(4, 0), CFG)[0] == 1  # min_replicas


def test_slo_pressure_adds_a_replica_while_loaded_and_sizing_says_how_many() -> None:
    want, why = desired(obs(2, 20, tpot=49.0), CFG)
    assert want == 3 and "TPOT p99" in why
    assert desired(obs(2, 20, tpot=60.0, predicted=5), CFG)[0] == 5
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
