"""`control.replicas.vllm.gang`: a planned gang's vLLM launches, node by node, on placements the real planner
makes (HGX H100 nodes on InfiniBand), and `python -m pools launch` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from control.replicas.vllm.gang import (
    EplbSettings,
    GangSettings,
    RankGroupLaunch,
    all2all_backend,
    gang_launches,
    ray_bundles,
    ray_stage_order_kept,
)
from pools.__main__ import main
from pools.model import PlacementRequest, PoolSpec, ReplicaPlacement, Role, placement_from_json
from pools.placement import place
from topology import read_source

pytestmark = pytest.mark.unit

CLUSTER = """name: two-hgx
fabric: {technology: ib-ndr}
racks:
  - name: r0
    nodes: [{name: hgx, template: hgx-h100, count: 2}]
"""
SETTINGS = GangSettings(model="/models/dsv3", address="10.0.0.1", port=8000, rpc_port=29550)


def planned(tmp_path: Path, pool: PoolSpec) -> ReplicaPlacement:
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER)
    plan = place(PlacementRequest(topology=read_source(str(path)), pools=(pool,)), "island-aligned")
    assert not plan.unplaced, plan.unplaced
    return plan.placements[0]


def flag(launch: RankGroupLaunch, name: str) -> str | None:
    return launch.argv[launch.argv.index(name) + 1] if name in launch.argv else None


def ep_pool(role: Role, dp: int) -> PoolSpec:
    return PoolSpec(name=role, role=role, tp=1, dp=dp, expert_parallel=True, replicas=1)


@pytest.mark.parametrize(("role", "backend"), [("decode", "deepep_low_latency"),
                                               ("prefill", "deepep_high_throughput")])
def test_ep_gang_over_two_nodes(tmp_path: Path, role: Role, backend: str) -> None:
    pool = ep_pool(role, 16)
    placement = planned(tmp_path, pool)
    assert placement.tier == "rdma" and not placement.in_domain
    head, other = gang_launches(placement, pool, SETTINGS)
    assert head.node != other.node and head.node == placement.members[0].node
    assert not head.headless and flag(head, "--data-parallel-start-rank") is None and head.port == 8000
    assert other.headless and "--headless" in other.argv and flag(other, "--data-parallel-start-rank") == "8"
    for launch in (head, other):
        assert flag(launch, "--data-parallel-size") == "16" and flag(launch, "--data-parallel-size-local") == "8"
        assert flag(launch, "--data-parallel-address") == "10.0.0.1"
        assert flag(launch, "--data-parallel-rpc-port") == "29550"
        assert "--enable-expert-parallel" in launch.argv and flag(launch, "--all2all-backend") == backend
        assert flag(launch, "--tensor-parallel-size") == "1" and flag(launch, "--scheduling-policy") == "priority"
        assert launch.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
        assert launch.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        nics = [m.nic for m in placement.members if m.node == launch.node]
        assert launch.env["NCCL_IB_HCA"] == ",".join(dict.fromkeys(str(n) for n in nics))
        assert json.loads(str(flag(launch, "--kv-transfer-config")))["engine_id"] == placement.replica_id
    assert head.dp_ranks == tuple(range(8)) and other.dp_ranks == tuple(range(8, 16))
    assert head.env["VLLM_HOST_IP"] == "10.0.0.1" and "VLLM_HOST_IP" not in other.env


def test_in_domain_gang_is_one_process(tmp_path: Path) -> None:
    pool = ep_pool("decode", 8)
    placement = planned(tmp_path, pool)
    assert placement.in_domain and placement.tier in ("nvlink", "local")
    (launch,) = gang_launches(placement, pool, SETTINGS)
    assert not launch.headless and launch.dp_ranks == tuple(range(8)) and len(launch.gpus) == 8
    assert flag(launch, "--data-parallel-size-local") == "8" and flag(launch, "--all2all-backend") == \
        "deepep_low_latency"


def test_external_lb_one_server_per_rank(tmp_path: Path) -> None:
    pool = ep_pool("decode", 16)
    placement = planned(tmp_path, pool)
    settings = GangSettings(model="m", address="10.0.0.1", external_lb=True,
                            eplb=EplbSettings(num_redundant_experts=32, window_size=500, step_interval=100))
    launches = gang_launches(placement, pool, settings)
    assert [flag(x, "--data-parallel-rank") for x in launches] == [str(r) for r in range(16)]
    for node in {x.node for x in launches}:
        assert [x.port for x in launches if x.node == node] == list(range(8000, 8008))
    for launch in launches:
        assert not launch.headless and "--headless" not in launch.argv and len(launch.gpus) == 1
        assert flag(launch, "--data-parallel-size") == "16" and flag(launch, "--port") == str(launch.port)
        assert "--enable-eplb" in launch.argv
        assert flag(launch, "--eplb-config") == \
            '{"num_redundant_experts":32,"window_size":500,"step_interval":100}'


def test_pipeline_gang_uses_ray_bundles_in_stage_order(tmp_path: Path) -> None:
    pool = PoolSpec(name="pp", role="mixed", tp=8, pp=2, replicas=1)
    placement = planned(tmp_path, pool)
    (launch,) = gang_launches(placement, pool, SETTINGS)
    assert flag(launch, "--pipeline-parallel-size") == "2"
    assert flag(launch, "--distributed-executor-backend") == "ray"
    assert "CUDA_VISIBLE_DEVICES" not in launch.env and "--data-parallel-size" not in launch.argv
    bundles = ray_bundles(placement)
    stages = sorted(placement.members, key=lambda m: m.pp_stage)
    want = [f"isle_gpu_{m.node.replace('-', '_')}_{g}" for m in stages for g in m.gpus]
    assert len(bundles) == 16 and all(b["GPU"] == 1.0 for b in bundles)
    assert [next(k for k in b if k != "GPU") for b in bundles] == want
    assert ray_stage_order_kept(placement, {})


@pytest.mark.parametrize(("role", "tier", "rdma", "want"), [
    ("prefill", "nvlink", False, "deepep_high_throughput"), ("decode", "local", False, "deepep_low_latency"),
    ("decode", "rdma", True, "deepep_low_latency"), ("mixed", "nvlink", True, "allgather_reducescatter"),
    ("decode", "tcp", False, "allgather_reducescatter"), ("prefill", "pcie", False, "allgather_reducescatter"),
    ("decode", "rack", False, "allgather_reducescatter"), ("decode", "rack", True, "deepep_low_latency")])
def test_all2all_rule(role: Role, tier: str, rdma: bool, want: str) -> None:
    assert all2all_backend(role, tier, rdma) == want  # type: ignore[arg-type]


def test_bad_inputs_are_named(tmp_path: Path) -> None:
    pool = ep_pool("decode", 16)
    placement = planned(tmp_path, pool)
    with pytest.raises(ValueError, match="no members"):
        gang_launches(ReplicaPlacement(replica_id="x", pool="decode", role="decode", node="n", gpus=(0,),
                                       island="i", tier="local", in_island=True), pool, SETTINGS)
    with pytest.raises(ValueError, match="pool wants pp=1 x dp=8"):
        gang_launches(placement, ep_pool("decode", 8), SETTINGS)
    with pytest.raises(ValueError, match="port 70000 is out of range"):
        gang_launches(placement, pool, GangSettings(model="m", address="a", port=70000))
    with pytest.raises(ValueError, match="rpc_port 8003 is an HTTP port"):
        gang_launches(placement, pool, GangSettings(model="m", address="a", rpc_port=8003, external_lb=True))


def test_placement_round_trips_through_plan_json(tmp_path: Path) -> None:
    pool = ep_pool("decode", 16)
    placement = planned(tmp_path, pool)
    plan = place(PlacementRequest(topology=read_source(str(tmp_path / "cluster.yaml")), pools=(pool,)),
                 "island-aligned")
    back = placement_from_json(plan.to_json()["placements"][0])
    assert back.members == placement.members and back.tier == placement.tier
    assert gang_launches(back, pool, SETTINGS) == gang_launches(placement, pool, SETTINGS)


def test_cli_launch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    (tmp_path / "pools.yaml").write_text("pools:\n  - {name: decode, role: decode, tp: 1, dp: 16, "
                                         "expert_parallel: true, replicas: 1, model: deepseek-v3}\n")
    assert main(["plan", "--topology", str(tmp_path / "cluster.yaml"), "--pools", str(tmp_path / "pools.yaml"),
                 "--format", "json"]) == 0
    (tmp_path / "plan.json").write_text(capsys.readouterr().out)
    args = ["launch", "--plan", str(tmp_path / "plan.json"), "--pools", str(tmp_path / "pools.yaml"),
            "--pool", "decode", "--address", "10.0.0.1", "--eplb-redundant", "32", "--format", "json"]
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [d["headless"] for d in doc] == [False, True] and doc[1]["dp_ranks"] == list(range(8, 16))
    assert set(doc[0]) == {"node", "argv", "env", "dp_ranks", "headless"} and "--enable-eplb" in doc[0]["argv"]
    assert main([*args[:-2], "--format", "text"]) == 0 and "--headless" in capsys.readouterr().out
    assert main([*args[:5], "--pool", "nope"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert main([*args, "--port", "0"]) == 2 and "out of range" in capsys.readouterr().err


def test_cli_launch_hands_every_process_the_plans_expert_domains(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    pools = tmp_path / "pools.yaml"
    pools.write_text("pools:\n  - {name: decode, role: decode, tp: 1, dp: 16, expert_parallel: true, replicas: 1, "
                     "model: deepseek-v3, experts: {policy: topology, redundant: 32}}\n")
    assert main(["plan", "--topology", str(tmp_path / "cluster.yaml"), "--pools", str(pools), "--format", "json"]) == 0
    (tmp_path / "plan.json").write_text(capsys.readouterr().out)
    args = ["launch", "--plan", str(tmp_path / "plan.json"), "--pools", str(pools), "--pool", "decode",
            "--gpu", "h100-sxm", "--expert-load-dir", "/var/isle/eplb", "--format", "json"]
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    specs = [json.loads(d["env"]["ISLE_EXPERT_SPEC"]) for d in doc]
    assert specs[0] == specs[1] and {d["env"]["ISLE_EXPERT_LOAD_DIR"] for d in doc} == {"/var/isle/eplb"}
    nodes = [d["node"] for d in doc]
    # EP rank r is DP rank r (tp=1): ranks 0-7 on the head's node and domain, 8-15 on the other's
    assert specs[0]["hosts"] == [nodes[0]] * 8 + [nodes[1]] * 8
    assert len(set(specs[0]["domains"][:8])) == 1 and set(specs[0]["domains"][:8]) != set(specs[0]["domains"][8:])
    assert specs[0]["model"] == "deepseek-v3" and specs[0]["locality"] is True
    assert "--enable-eplb" in doc[0]["argv"]  # the pool's redundant experts turn EPLB on
    # the pool asks for vLLM's own EPLB: no spec, vLLM's policy stays
    pools.write_text(pools.read_text().replace("policy: topology", "policy: eplb"))
    assert main(args) == 0
    assert all("ISLE_EXPERT_SPEC" not in d["env"] for d in json.loads(capsys.readouterr().out))
