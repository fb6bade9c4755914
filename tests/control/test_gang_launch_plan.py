"""A gang replica in the controller, over fake replicas (no processes): one launch and engine per
data-parallel rank, whose `sim-engine --gang` prices steps as the simulator does; all ranks or
none at a start; a rank down restarts the whole gang; a lost node re-places it whole; the saved
state keeps the gang's members, and a resumed controller reattaches to every rank."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from control.controller import ControllerCore
from control.launch import gang
from control.launch.build import build_launch
from control.spec import ControllerSpec
from control.state import saved as state
from pools.ganglinks import gang_cost
from pools.model import PlacementPlan, PlacementRequest, PoolSpec
from pools.placement import get_policy
from pools.vllmconfig import VllmSettings
from simengine import cli as run
from tests.control.conftest import PAIRS, FakeBackend, FakeReplica, HeldStarts, controller_spec, events
from topology import read_source

pytestmark = pytest.mark.unit
MOE = PoolSpec(name="moe", role="mixed", tp=1, dp=4, replicas=1, model="qwen3-30b-a3b", expert_parallel=True,
               slo_classes=("interactive", "standard", "batch"))


Gang = FakeBackend[FakeReplica]
Deployed = tuple[ControllerCore, Gang, HeldStarts]


def _plan() -> tuple[PlacementPlan, Any]:
    topology = read_source(PAIRS)
    return get_policy("island-aligned").place(PlacementRequest(topology=topology, pools=(MOE,))), topology


def _spec(tmp_path: Path) -> ControllerSpec:
    return controller_spec(tmp_path, MOE, time_scale=1.0)


def _ranks(core: ControllerCore) -> gang.GangReplica:
    replica = core.running["moe-0"].replica
    assert isinstance(replica, gang.GangReplica)
    return replica


@pytest.fixture
def deployed(tmp_path: Path) -> Iterator[Deployed]:
    """Fake replicas (those named in `starts.fail` do not start); `attach` finds a running one."""
    starts = HeldStarts()
    backend = FakeBackend(starts, nodes=("a", "b"), attachable=lambda r: r.alive)
    core = ControllerCore(_spec(tmp_path), backend)
    core.deploy()
    try:
        yield core, backend, starts
    finally:
        core.shutdown()


def test_one_launch_per_rank_whose_engine_prices_steps_as_the_simulator() -> None:
    plan, topology = _plan()
    p = plan.placements[0]
    launch = build_launch(plan, topology, {}, p, 3, topology_source=PAIRS, time_scale=1.0)
    assert [r.actor_name for r in launch.ranks] == [f"isleserve-moe-0-dp{k}-g3" for k in range(4)]
    assert [(r.node, r.gpus) for r in launch.ranks] == [(m.node, m.gpus) for m in p.members]
    assert [r.environment()["CUDA_VISIBLE_DEVICES"] for r in launch.ranks] == [str(m.gpus[0]) for m in p.members]
    parser = argparse.ArgumentParser()
    run.add_arguments(parser)
    for k, rank in enumerate(launch.ranks):
        args = parser.parse_args(rank.command()[3:])
        assert json.loads(args.gang)["dp_rank"] == k
        assert run.build(args).config.gang == gang_cost(topology, plan, p)  # as loadtest/sim/replica.py builds it
    settings = VllmSettings(model="Qwen/Qwen3-30B-A3B", served_model_name="qwen3-30b-a3b", python="python")
    with pytest.raises(ValueError, match="gangs on the simulated engine only"):
        build_launch(plan, topology, {}, p, 0, topology_source=PAIRS, time_scale=1.0, vllm=settings)


@pytest.mark.parametrize(("change", "message"), [
    ({"dp": 1}, "dp=1 pp=1 is not a gang"),
    ({"dp_rank": 4}, "dp_rank 4 is not a rank of dp=4"),
    ({"members": [{"node": "z", "gpus": [0], "dp_rank_start": 0}]}, "node z GPU 0 is not in the topology"),
    ({"dp_rank": 1}, "--placement a:[0] is not rank 1's first member a:[1]"),
    ({"members": "none"}, "--gang: want {dp, pp, expert_parallel, dp_rank, members"),
])
def test_sim_engine_gang_argument_errors_say_what_is_wrong(change: dict[str, Any], message: str) -> None:
    plan, _ = _plan()
    doc = {**json.loads(gang.gang_arg(MOE, plan.placements[0], 0)), **change}
    parser = argparse.ArgumentParser()
    run.add_arguments(parser)
    args = parser.parse_args(["--model", "qwen3-30b-a3b", "--gpu", "a30", "--topology", PAIRS, "--placement",
                              '{"node": "a", "gpus": [0]}', "--gang", json.dumps(doc)])
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("{", r"\{")):
        run.build(args)


def test_the_saved_state_keeps_a_gangs_members(tmp_path: Path) -> None:
    plan, _ = _plan()
    saved = state.ControllerState(session="s", spec_digest="d", plan=plan, table_version=3,
                                  replicas={"moe-0": state.SavedReplica(placement=plan.placements[0], generation=2)})
    state.save(str(tmp_path), saved)
    back = state.load(str(tmp_path), plan.pools, plan.slo_classes)
    assert back is not None and back.plan.placements == plan.placements
    assert back.replicas["moe-0"].placement.members == plan.placements[0].members


def test_every_rank_is_published_and_a_rank_down_restarts_the_whole_gang(
        deployed: Deployed, tmp_path: Path) -> None:
    core, _, _ = deployed
    table = core.table
    assert [(r.replica_id, r.gang, r.dp_rank) for r in table.replicas] == [
        (f"moe-0-dp{k}", "moe-0", k) for k in range(4)]
    assert [r.url for r in table.replicas] == [f"http://fake/isleserve-moe-0-dp{k}-g0" for k in range(4)]
    old = _ranks(core).members
    assert isinstance(old[2], FakeReplica)
    old[2].alive = False  # one rank's engine died
    core.check()
    table = core.settle(timeout_s=10)
    assert [r.url for r in table.replicas] == [f"http://fake/isleserve-moe-0-dp{k}-g1" for k in range(4)]
    assert all(isinstance(r, FakeReplica) and r.stopped.is_set() for r in old)  # the living ranks too
    restart = events(tmp_path, "restart")[-1]
    assert restart["result"] == "the whole gang, new generation" and "rank moe-0-dp2 is down" in restart["error"]


def test_a_rank_that_fails_to_start_stops_the_gang_and_says_why(
        deployed: Deployed, tmp_path: Path) -> None:
    core, backend, starts = deployed
    starts.fail.add("isleserve-moe-0-dp1-g1")
    first = _ranks(core).members[0]
    assert isinstance(first, FakeReplica)
    first.alive = False
    core.check()
    core.settle(timeout_s=10)
    failed = events(tmp_path, "gang_failed")
    assert failed == [{**failed[0], "replica_id": "moe-0", "rank": "moe-0-dp1", "reason": "engine did not start",
                       "stopped": ["moe-0-dp0"], "start": "restart", "generation": 1}]
    assert backend.by_name["isleserve-moe-0-dp0-g1"].stopped.is_set()
    assert "isleserve-moe-0-dp2-g1" not in backend.by_name  # the ranks after it never started
    starts.fail.clear()
    core.check()  # tried again, whole
    assert [r.url for r in core.settle(timeout_s=10).replicas] == [
        f"http://fake/isleserve-moe-0-dp{k}-g2" for k in range(4)]


def test_a_lost_node_re_places_the_gang_as_a_unit(deployed: Deployed) -> None:
    core, backend, _ = deployed
    assert {m.node for m in core.running["moe-0"].placement.members} == {"a"}
    backend.alive["a"] = False
    core.check()
    table = core.settle(timeout_s=10)
    assert {m.node for m in core.running["moe-0"].placement.members} == {"b"}
    assert [(r.replica_id, r.node, r.healthy) for r in table.replicas] == [
        (f"moe-0-dp{k}", "b", True) for k in range(4)]
    assert all(r.node == "b" and r.generation == 1 for r in _ranks(core).launch.ranks)


def test_a_resumed_controller_reattaches_to_every_rank(deployed: Deployed,
                                                        tmp_path: Path) -> None:
    core, backend, _ = deployed
    before = _ranks(core).members
    again = ControllerCore(_spec(tmp_path), backend)
    assert again._resume()
    assert _ranks(again).members == before
    assert [r.replica_id for r in again.table.replicas] == [f"moe-0-dp{k}" for k in range(4)]
