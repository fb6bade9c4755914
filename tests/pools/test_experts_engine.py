"""What the isleserve vLLM plugin decides inside vLLM (`pools.experts.engine`), the step objective
that makes the topology policy never slower than EPLB, the named shapes, the load formats a user
brings (vLLM EPLB records, SGLang's expert distribution), and the launcher's spec."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from physics import catalog
from pools.experts.engine import ExpertSpec, local_replicas, rebalance, spec_for, spec_from_env
from pools.experts.load import read_load, synthetic
from pools.experts.metrics import Gang, replicas, route
from pools.experts.objective import objective
from pools.experts.policies import eplb, topology
from pools.experts.shapes import SHAPES
from pools.model import placement_from_json
from tests.conftest import ROOT

pytestmark = pytest.mark.unit

PLAN = {"replica_id": "decode-0", "pool": "decode", "role": "decode", "node": "n0", "gpus": [0, 1],
        "island": "n0/island0+n1/island0", "tier": "rdma", "expert_parallel": 4,
        "members": [{"node": "n1", "gpus": [0], "dp_rank_start": 2, "pp_stage": 0, "nic": "mlx5_0"},
                    {"node": "n0", "gpus": [0], "dp_rank_start": 0, "pp_stage": 0, "nic": "mlx5_0"},
                    {"node": "n0", "gpus": [1], "dp_rank_start": 1, "pp_stage": 0, "nic": "mlx5_0"},
                    {"node": "n1", "gpus": [1], "dp_rank_start": 3, "pp_stage": 0, "nic": "mlx5_0"}]}


def spec(**kw: Any) -> ExpertSpec:
    base: dict[str, Any] = {"domains": ("d0", "d0", "d1", "d1"), "hosts": ("h0", "h0", "h1", "h1"),
                            "model": "deepseek-v3", "gpu": "h100-sxm"}
    return ExpertSpec(**{**base, **kw})


def test_the_launchers_spec_lists_ranks_in_vllms_ep_order_and_round_trips(tmp_path: Path) -> None:
    found = spec_for(placement_from_json(PLAN), "deepseek-v3", "h800-sxm")
    assert found.domains == ("n0/island0", "n0/island0", "n1/island0", "n1/island0")  # DP rank order, not plan order
    assert found.hosts == ("n0", "n0", "n1", "n1") and found.model == "deepseek-v3" and found.phase == "decode"
    assert spec_for(placement_from_json(PLAN), "llama-3.1-8b").model is None  # dense: no step to price
    path = tmp_path / "spec.json"
    path.write_text(found.to_json())
    assert spec_from_env({"ISLE_EXPERT_SPEC": f"@{path}"}) == found
    assert spec_from_env({"ISLE_EXPERT_SPEC": found.to_json()}) == found
    assert spec_from_env({}) is None


@pytest.mark.parametrize("text, message", [
    ('{"domains": ["a"], "hosts": []}', "one of each per EP rank"),
    ('{"domains": ["a"], "hosts": ["h"], "model": "nope"}', "not in the catalogue"),
    ('{"domains": ["a"], "hosts": ["h"], "colour": 1}', "unknown keys ['colour']"),
    ('{"domains": ["a"], "hosts": ["h"], "phase": "both"}', "phase 'both'"),
    ("[1, 2]", "want a JSON object"),
    ("{", "not JSON"),
])
def test_a_bad_spec_is_refused_with_the_reason(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="ISLE_EXPERT_SPEC") as err:
        spec_from_env({"ISLE_EXPERT_SPEC": text})
    assert message in str(err.value)


def test_rebalance_keeps_vllms_map_where_it_is_as_fast_and_moves_few_weights() -> None:
    s = spec()
    experts, physical = 16, 24
    skewed = synthetic(experts, 2, skew=1.4, seed=5, topk=4).layers
    gang = s.gang()
    theirs = [[e for held in eplb([x / sum(r) for x in r], gang, physical) for e in held] for r in skewed]
    old = [list(range(experts)) + list(range(physical - experts)) for _ in skewed]
    ours = rebalance(s, skewed, physical, 1, theirs, old)
    step = objective(catalog.model("deepseek-v3"), catalog.gpu("h100-sxm"), s.links(), s.ranks)
    per = physical // s.ranks
    for k, row in enumerate(skewed):
        shares = [x / sum(row) for x in row]
        as_map = tuple(tuple(sorted(ours[k][r * per:(r + 1) * per])) for r in range(s.ranks))
        vllm = tuple(tuple(sorted(theirs[k][r * per:(r + 1) * per])) for r in range(s.ranks))
        assert sorted(ours[k]) == sorted(e for held in as_map for e in held) and all(replicas(as_map, experts))
        assert step(route(shares, as_map, gang)) <= step(route(shares, vllm, gang))
        assert as_map != vllm  # two domains, skewed: a map that keeps hot experts local wins here
        # a rank keeps an expert in the slot it already held when the new map leaves it there
        for r in range(s.ranks):
            for j in range(r * per, (r + 1) * per):
                if old[k][j] in as_map[r] and ours[k][j] != old[k][j]:
                    assert old[k][j] in ours[k][r * per:(r + 1) * per]
    # no step to price (a model the catalogue lacks): vLLM's map unless ours is as balanced and more local
    for row in (tuple([1.0] * experts), skewed[0]):
        shares = [x / sum(row) for x in row]
        flat = [e for held in eplb(shares, gang, physical) for e in held]
        got = rebalance(spec(model=None), [row], physical, 1, [flat])[0]
        if got != flat:
            a = route(shares, tuple(tuple(sorted(got[r * per:(r + 1) * per])) for r in range(s.ranks)), gang)
            b = route(shares, tuple(tuple(sorted(flat[r * per:(r + 1) * per])) for r in range(s.ranks)), gang)
            assert a.balancedness >= b.balancedness and a.cross_share < b.cross_share


def test_local_replicas_keep_a_rank_to_its_domains_copies() -> None:
    phys2log = [0, 1, 2, 0, 3, 1, 2, 3]  # 4 ranks x 2 slots; ranks 0-1 in d0, 2-3 in d1
    domains = ["d0", "d0", "d1", "d1"]
    assert local_replicas(phys2log, domains, 0, 4) == [[0, 3], [1], [2], [4, 7]]  # no copy of 3 in d0: all
    assert local_replicas(phys2log, domains, 3, 4) == [[0, 3], [5], [6], [4, 7]]


@pytest.mark.parametrize("name", sorted(SHAPES))
@pytest.mark.parametrize("skew", [1.3, 0.0])
@pytest.mark.parametrize("locality", [True, False])
def test_the_topology_policy_is_never_slower_than_eplb(name: str, skew: float, locality: bool) -> None:
    shape = SHAPES[name]
    model = catalog.model("deepseek-v3")
    assert model.moe is not None
    redundant = 16 if shape.gang.size == 16 else 32
    physical = model.moe.routed_experts + redundant
    step = objective(model, catalog.gpu(shape.gpu), shape.links, shape.gang.size, shape.phase)
    load = synthetic(model.moe.routed_experts, 2, skew=skew, seed=1, topk=model.moe.experts_per_token,
                     groups=model.moe.groups, groups_per_token=model.moe.groups_per_token)
    for k in range(2):
        shares = load.shares(k)
        theirs = eplb(shares, shape.gang, physical, model.moe.groups)
        ours = topology(shares, shape.gang, physical, model.moe.groups, step=step, locality=locality)
        assert step(route(shares, ours, shape.gang, locality)) <= step(route(shares, theirs, shape.gang, locality))


def test_without_locality_tokens_spread_over_every_copy() -> None:
    gang = Gang.uniform(2, 2)
    layer = ((0, 1), (2, 3), (0, 2), (1, 3))  # every expert once per domain
    shares = [0.4, 0.3, 0.2, 0.1]
    assert route(shares, layer, gang, True).cross_share == 0.0
    assert route(shares, layer, gang, False).cross_share == pytest.approx(0.5)


def test_a_tp2_dp2_gang_lists_each_dp_ranks_tp_ranks_in_order() -> None:
    plan = {**PLAN, "members": [
        {"node": "n1", "gpus": [2, 3], "dp_rank_start": 1, "pp_stage": 0, "nic": None},
        {"node": "n0", "gpus": [0, 1], "dp_rank_start": 0, "pp_stage": 0, "nic": None}],
        "island": "n0/island0+n1/island0"}
    found = spec_for(placement_from_json(plan), "deepseek-v3")
    assert found.hosts == ("n0", "n0", "n1", "n1") and found.ranks == 4  # EP rank = DP rank x TP + TP rank


def test_a_shape_and_a_plan_together_are_refused(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "pools", "experts", "--model", "deepseek-v3", "--shape", "nvl72",
                          "--plan", str(tmp_path / "p.json"), "--pool", "decode", "--load", "zipf:1"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
    assert out.returncode == 2 and "--shape names a gang of its own" in out.stderr


def test_the_experts_command_compares_both_policies_both_ways() -> None:
    out = subprocess.run([sys.executable, "-m", "pools", "experts", "--model", "deepseek-v3", "--shape",
                          "b200x2-ep16", "--redundant", "16", "--load", "zipf:1.3", "--compare", "--format", "json"],
                         capture_output=True, text=True, cwd=ROOT, check=True, timeout=120)
    rows = {(r["policy"], r["locality"]): r["summary"] for r in json.loads(out.stdout)}
    assert set(rows) == {("eplb", True), ("eplb", False), ("topology", True), ("topology", False)}
    for local in (True, False):
        assert rows[("topology", local)]["step_ms"] <= rows[("eplb", local)]["step_ms"]
    assert rows[("topology", True)]["cross_domain_share"] < rows[("eplb", True)]["cross_domain_share"]


def test_load_files_in_every_form_read_alike(tmp_path: Path) -> None:
    table = [[5.0, 0.0, 3.0], [1.0, 1.0, 1.0]]
    forms = {
        "ours.json": json.dumps({"layers": table}),
        "record.json": json.dumps({"layers": table, "source": "vllm-eplb", "num_ranks": 4}),
        "sglang.json": json.dumps({"logical_count": [[0, 0, 0], *table]}),  # a dense layer first
        "sglang3d.json": json.dumps({"logical_count": [[[0, 0, 0], [2, 0, 1], [1, 0, 0]],
                                                       [[0, 0, 0], [3, 0, 2], [0, 1, 1]]]}),
        "bare.json": json.dumps([[[0, 0, 0], *table]]),
        "sglang.csv": "layer_id,expert_id,count\n3,0,5\n3,2,3\n4,0,1\n4,1,1\n4,2,1\n",
    }
    for name, text in forms.items():
        (tmp_path / name).write_text(text)
        assert [list(r) for r in read_load(str(tmp_path / name), 3).layers] == table, name
    for name, text, message in [("x.pt", "", "save its logical_count as JSON"),
                                ("bad.csv", "layer_id,expert_id,count\n1,x,3\n", "line 2"),
                                ("zero.json", '{"logical_count": [[0, 0]]}', "all zero"),
                                ("odd.json", '{"logical_count": [[[1, 2]], [[1, 2], [3, 4]]]}', "rows hold"),
                                ("vllm.log", "INFO 12-04 07:18:50 [eplb_state.py:635] EPLB step: 3000 for model m: "
                                 "avg_tokens=812.50, max_tokens=1210, balancedness=0.6715\n", "per-GPU totals")]:
        (tmp_path / name).write_text(text)
        with pytest.raises(ValueError, match=message):
            read_load(str(tmp_path / name))
