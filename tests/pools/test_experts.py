"""Expert placement inside an EP gang: topology-aware maps against DeepSeek's EPLB and vLLM's
linear default, on gangs spanning two or more NVLink domains with tokens at every rank."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pools.__main__ import main
from pools.experts.load import synthetic, validate
from pools.experts.metrics import Gang, replicas, route
from pools.experts.policies import POLICIES, eplb, topology

pytestmark = pytest.mark.unit

CASES = [  # (experts, topk, groups, groups per token, domains, GPUs per domain, redundant)
    (256, 8, 8, 4, 4, 8, 32),     # DeepSeek-V3 EP32 over four HGX nodes
    (256, 8, 8, 4, 2, 8, 16),     # EP16 over two
    (128, 8, 1, 1, 4, 8, 32),     # Qwen3-235B EP32 (no groups: EPLB's global policy)
    (128, 4, 1, 1, 2, 16, 32),    # gpt-oss-120b EP32 over two 16-GPU domains
]


def figures(policy: str, case: tuple[int, ...], skew: float, seed: int) -> tuple[float, float]:
    experts, topk, groups, gpt, domains, per, redundant = case
    gang = Gang.uniform(domains, per)
    load = synthetic(experts, 3, skew=skew, seed=seed, topk=topk, groups=groups, groups_per_token=gpt)
    bal = cross = 0.0
    for k in range(3):
        shares = load.shares(k)
        layer = POLICIES[policy](shares, gang, experts + redundant, groups)
        assert all(len(held) == (experts + redundant) // gang.size for held in layer)
        assert all(replicas(layer, experts))  # every expert somewhere
        st = route(shares, layer, gang)
        assert sum(st.gpu_load) == pytest.approx(1.0)
        bal += st.balancedness / 3
        cross += st.cross_share / 3
    return bal, cross


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_topology_keeps_pairs_inside_domains_without_losing_balance(case: tuple[int, ...], seed: int) -> None:
    for skew, bound in ((1.3, 0.8), (0.8, 1.0)):
        ours_bal, ours_cross = figures("topology", case, skew, seed)
        eplb_bal, eplb_cross = figures("eplb", case, skew, seed)
        assert ours_cross <= bound * eplb_cross, (case, skew, ours_cross, eplb_cross)
        assert ours_bal >= eplb_bal - 0.02, (case, skew, ours_bal, eplb_bal)


def test_eplb_keeps_a_group_on_one_host_and_replicates_the_hottest() -> None:
    gang = Gang.uniform(2, 8, hosts_per_domain=1)
    load = synthetic(64, 1, skew=1.2, seed=3, topk=4, groups=4, groups_per_token=2)
    shares = load.shares(0)
    layer = eplb(shares, gang, 64 + 16, 4)
    where = replicas(layer, 64)
    for g in range(4):
        hosts = {gang.host[r] for e in range(g * 16, (g + 1) * 16) for r in where[e]}
        assert len(hosts) == 1
    hottest = max(range(64), key=lambda e: shares[e])
    assert len(where[hottest]) == max(len(w) for w in where) > 1


def test_topology_gives_hot_experts_a_replica_in_every_domain() -> None:
    gang = Gang.uniform(4, 8)
    shares = synthetic(256, 1, skew=1.3, seed=5, topk=8).shares(0)
    where = replicas(topology(shares, gang, 288, 1), 256)
    for e in sorted(range(256), key=lambda e: -shares[e])[:4]:
        assert {gang.domain[r] for r in where[e]} == set(gang.domain)


def test_one_domain_crosses_nothing() -> None:
    gang = Gang.uniform(1, 32)
    shares = synthetic(256, 1, skew=1.3, seed=0, topk=8).shares(0)
    for policy in POLICIES.values():
        assert route(shares, policy(shares, gang, 256 + 32, 8), gang).cross_share == 0.0


def test_bad_maps_and_loads_are_refused() -> None:
    with pytest.raises(ValueError, match="same number on every GPU"):
        topology([1 / 10] * 10, Gang.uniform(2, 3), 10, 1)
    with pytest.raises(ValueError, match="layers\\[1\\] has 3 experts"):
        validate([[1, 2, 3, 4], [1, 2, 3]])
    with pytest.raises(ValueError, match="numbers >= 0"):
        validate([[1, -2]])


def plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    pools = tmp_path / "pools.yaml"
    pools.write_text("pools:\n  - {name: decode, role: decode, tp: 1, dp: 32, expert_parallel: true, replicas: 1, "
                     "model: deepseek-v3}\n")
    cluster = Path(__file__).resolve().parents[2] / "configs" / "clusters" / "moe-rdma.yaml"
    assert main(["plan", "--topology", str(cluster), "--pools", str(pools), "--format", "json"]) == 0
    out = tmp_path / "plan.json"
    out.write_text(capsys.readouterr().out)
    return out


def experts(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["experts", *args, "--format", "json"]) == 0
    answer: dict[str, Any] = json.loads(capsys.readouterr().out)
    return answer


def test_experts_command_compares_the_three_policies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = plan(tmp_path, capsys)
    base = ["--model", "deepseek-v3", "--plan", str(path), "--pool", "decode", "--redundant", "32"]
    got = {p: experts(capsys, *base, "--load", "zipf:1.3:1", "--policy", p) for p in ("linear", "eplb", "topology")}
    for answer in got.values():
        assert answer["ep"] == 32 and len(answer["domains"]) == 4 and len(answer["layers"]) == 4
        layer = answer["layers"][0]
        assert len(layer["gpu_of"]) == 256 and sum(len(g) for g in layer["gpu_of"].values()) == 288
        assert set(answer["summary"]) >= {"balancedness", "cross_domain_bytes_per_token", "step_ms"}
    s = {p: a["summary"] for p, a in got.items()}
    assert s["topology"]["cross_domain_bytes_per_token"] <= 0.8 * s["eplb"]["cross_domain_bytes_per_token"]
    assert s["linear"]["step_ms"] > max(s["eplb"]["step_ms"], s["topology"]["step_ms"])
    load = tmp_path / "load.json"
    load.write_text(json.dumps({"layers": [[1.0] * 256, [float(k % 7) for k in range(256)]]}))
    mine = experts(capsys, *base, "--load", str(load))
    assert mine["policy"] == "topology" and len(mine["layers"]) == 2
    assert main(["experts", *base, "--load", "zipf:x", "--format", "json"]) == 2
    assert "zipf:SKEW" in capsys.readouterr().err
    assert main(["experts", *base[:-2], "--redundant", "3", "--load", "zipf:1", "--format", "json"]) == 2
    assert "(E + R) % EP == 0" in capsys.readouterr().err


def test_a_pool_can_ask_for_its_expert_map_with_the_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`experts:` in a pool: the plan JSON carries each EP gang's map figures, `isle status`
    shows them, and a redundancy that does not split over the gang is a config error."""
    from isleserve.status import render

    cluster = Path(__file__).resolve().parents[2] / "configs" / "clusters" / "moe-rdma.yaml"
    pools = tmp_path / "pools.yaml"
    line = ("pools:\n  - {name: decode, role: decode, tp: 1, dp: 32, expert_parallel: true, replicas: 1, "
            "model: deepseek-v3, experts: {policy: POLICY, redundant: R}}\n")
    got = {}
    for policy in ("topology", "eplb"):
        pools.write_text(line.replace("POLICY", policy).replace("R", "32"))
        assert main(["plan", "--topology", str(cluster), "--pools", str(pools), "--format", "json"]) == 0
        got[policy] = json.loads(capsys.readouterr().out)
    figures = {p: d["placements"][0]["experts"] for p, d in got.items()}
    assert figures["topology"]["cross_domain_share"] <= 0.8 * figures["eplb"]["cross_domain_share"]
    assert figures["topology"]["redundant"] == 32 and figures["topology"]["policy"] == "topology"
    assert sum(figures["topology"]["domain_load"].values()) == pytest.approx(1.0, abs=1e-3)
    assert len(figures["topology"]["domain_load"]) == 4
    text = render({"url": "http://x", "plan": got["topology"], "replicas": {"version": 1, "replicas": []},
                   "topology": None})
    assert "gang decode-0: 32 rank groups, across 4 domains" in text and "experts topology (+32 redundant)" in text
    pools.write_text(line.replace("POLICY", "topology").replace("R", "30"))
    assert main(["plan", "--topology", str(cluster), "--pools", str(pools), "--format", "json"]) == 2
    assert "experts.redundant" in capsys.readouterr().err


def test_eplb_reproduces_deepseeks_published_example() -> None:
    """deepseek-ai/EPLB README (and vLLM's test_basic_rebalance): 12 experts in 4 groups, 16
    replicas on 2 nodes of 4 GPUs; the experts each GPU holds match its printed phy2log."""
    from topology import GpuRef

    weight = [[90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
              [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27]]
    phy2log = [[5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
               [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1]]
    hosts = tuple(f"h{k // 4}" for k in range(8))
    gang = Gang(gpus=tuple(GpuRef(h, k % 4) for k, h in enumerate(hosts)), domain=hosts, host=hosts)
    for row, want in zip(weight, phy2log, strict=True):
        layer = eplb([w / sum(row) for w in row], gang, 16, 4)
        assert [sorted(held) for held in layer] == [sorted(want[2 * g:2 * g + 2]) for g in range(8)]


def test_launch_hands_the_pools_redundant_experts_to_vllms_eplb(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    cluster = Path(__file__).resolve().parents[2] / "configs" / "clusters" / "moe-rdma.yaml"
    pools = tmp_path / "pools.yaml"
    pools.write_text("pools:\n  - {name: decode, role: decode, tp: 1, dp: 32, expert_parallel: true, replicas: 1, "
                     "model: deepseek-v3, experts: {policy: topology, redundant: 32}}\n")
    assert main(["plan", "--topology", str(cluster), "--pools", str(pools), "--format", "json"]) == 0
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(capsys.readouterr().out)
    assert main(["launch", "--plan", str(plan_path), "--pools", str(pools), "--pool", "decode",
                 "--format", "json"]) == 0
    launches = json.loads(capsys.readouterr().out)
    argv = launches[0]["argv"]
    assert "--enable-eplb" in argv
    assert json.loads(argv[argv.index("--eplb-config") + 1])["num_redundant_experts"] == 32
