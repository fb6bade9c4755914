"""Every vLLM command the gang launcher writes, parsed by vLLM's own server parser and checked by
its own validation (`vllm.entrypoints.launchers.cli_args`, as `python -m
vllm.entrypoints.openai.api_server` does before it starts), then turned into its engine
arguments: DP + EP across two nodes (head and headless), prefill and decode, external load
balancing with EPLB, and a pipeline on the Ray executor."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from control.replicas.vllm.gang import EplbSettings, GangSettings, gang_launches
from pools.model import PlacementRequest, PoolSpec, ReplicaPlacement
from pools.placement import place
from tests.vllm.conftest import PYTHON
from topology import read_source

pytestmark = pytest.mark.vllm

CLUSTER = "racks:\n  - name: r0\n    nodes: [{name: hgx, template: hgx-h100, count: 2}]\n"
PARSE = """
import json, sys
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser
out = []
for argv in json.load(sys.stdin):
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    validate_parsed_serve_args(args)
    engine = AsyncEngineArgs.from_cli_args(args)
    out.append({k: getattr(engine, k, None) for k in (
        "data_parallel_size", "data_parallel_size_local", "data_parallel_start_rank", "data_parallel_address",
        "data_parallel_rpc_port", "data_parallel_rank", "enable_expert_parallel", "all2all_backend", "enable_eplb",
        "pipeline_parallel_size", "tensor_parallel_size", "distributed_executor_backend")}
               | {"headless": getattr(args, "headless", None),
                  "eplb_redundant": getattr(getattr(engine, "eplb_config", None), "num_redundant_experts", None)})
print(json.dumps(out, default=str))
"""


def placed(tmp_path: Path, pool: PoolSpec) -> ReplicaPlacement:
    path = tmp_path / "cluster.yaml"
    path.write_text(CLUSTER)
    plan = place(PlacementRequest(topology=read_source(str(path)), pools=(pool,)), "island-aligned")
    assert not plan.unplaced
    return plan.placements[0]


def parsed(argvs: list[list[str]]) -> list[dict[str, Any]]:
    """vLLM's view of each command line (the arguments after `python -m MODULE`)."""
    result = subprocess.run([str(PYTHON), "-c", PARSE], input=json.dumps([a[3:] for a in argvs]),
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    answer: list[dict[str, Any]] = json.loads(result.stdout.strip().splitlines()[-1])
    return answer


@pytest.mark.parametrize("role, backend", [("decode", "deepep_low_latency"), ("prefill", "deepep_high_throughput")])
def test_dp_ep_commands_across_two_nodes_parse(tmp_path: Path, role: str, backend: str) -> None:
    pool = PoolSpec(name=role, role=role, tp=1, dp=16, expert_parallel=True, replicas=1)  # type: ignore[arg-type]
    launches = gang_launches(placed(tmp_path, pool), pool,
                             GangSettings(model="/models/m", address="10.0.0.1", port=8000, rpc_port=29550))
    head, other = parsed([x.argv for x in launches])
    for got in (head, other):
        assert got["data_parallel_size"] == 16 and got["data_parallel_size_local"] == 8
        assert got["data_parallel_address"] == "10.0.0.1" and got["data_parallel_rpc_port"] == 29550
        assert got["enable_expert_parallel"] is True and got["all2all_backend"] == backend
    assert not head["headless"] and other["headless"] and other["data_parallel_start_rank"] == 8


def test_external_lb_with_eplb_parses(tmp_path: Path) -> None:
    pool = PoolSpec(name="decode", role="decode", tp=1, dp=16, expert_parallel=True, replicas=1)
    settings = GangSettings(model="/models/m", address="10.0.0.1", external_lb=True,
                            eplb=EplbSettings(num_redundant_experts=32, window_size=500, step_interval=100))
    got = parsed([x.argv for x in gang_launches(placed(tmp_path, pool), pool, settings)])
    assert [g["data_parallel_rank"] for g in got] == list(range(16))
    assert all(g["enable_eplb"] and g["eplb_redundant"] == 32 for g in got)


def test_pipeline_on_the_ray_executor_parses(tmp_path: Path) -> None:
    pool = PoolSpec(name="pp", role="mixed", tp=8, pp=2, replicas=1)
    (got,) = parsed([x.argv for x in gang_launches(placed(tmp_path, pool), pool,
                                                   GangSettings(model="/models/m", address="10.0.0.1"))])
    assert got["pipeline_parallel_size"] == 2 and got["tensor_parallel_size"] == 8
    assert got["distributed_executor_backend"] == "ray"
