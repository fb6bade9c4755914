"""Every file in configs/ loads and validates; configs/prod.yaml plans onto two HGX H100 nodes
discovered through (fake) NVML exactly as a deployment would."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from isleserve.planning import plan_for, resolve_topology
from isleserve.settings import app_args_from_serve_config, parse_app_args
from pools.config import load_pools
from pools.placement.validate import validate_plan
from tests.conftest import ROOT
from tests.support import fake_nvml
from topology import Topology, read_source
from topology.errors import ParseError
from topology.readers.nvml import discover

pytestmark = pytest.mark.unit

CONFIGS = sorted(p for p in (ROOT / "configs").rglob("*") if p.is_file())


@pytest.mark.parametrize("path", CONFIGS, ids=[str(p.relative_to(ROOT)) for p in CONFIGS])
def test_every_config_file_is_valid(path: Path) -> None:
    rel = path.relative_to(ROOT / "configs")
    if rel.parts[0] == "clusters":
        assert read_source(str(path)).gpu_count > 0
    elif rel.parts[0] == "pools":
        assert load_pools(str(path)).pools
    elif rel.parts[0] == "scenarios":
        from loadtest.scenario import load_scenario

        scenario = load_scenario(path)
        assert scenario.pools() and scenario.profiles() and scenario.topology.gpu_count > 0
    elif rel.parts[0] == "tokenizers":  # a tokenizer for `vllm bench serve` against the simulated engines
        doc = json.loads(path.read_text())
        if path.name == "tokenizer.json":
            words = [w for w in doc["model"]["vocab"] if not w.startswith("<")]
            # every word longer than the simulated engines' 4 bytes a token, so vllm bench's trim applies
            assert words and all(w.isascii() and w.isalpha() and len(w) >= 10 for w in words)
        else:
            assert doc["tokenizer_class"] == "PreTrainedTokenizerFast"
    elif path.suffix == ".json":
        assert json.loads(path.read_text())["panels"]
    elif path.name in ("chaos.yaml", "chaos-kv.yaml"):
        from loadtest.chaos.spec import load_chaos_spec

        spec, base = load_chaos_spec(path)
        assert spec.faults and base.exists()
    elif path.name == "prometheus.yml":
        from router.targets import PATH

        jobs = {j["job_name"]: j for j in yaml.safe_load(path.read_text())["scrape_configs"]}
        assert set(jobs) == {"isle-router", "isle-engines"}
        for job in jobs.values():
            for sd in job["http_sd_configs"]:  # the router's discovery, with the admin key as a bearer token
                assert sd["url"].endswith(PATH) and sd["authorization"]["type"] == "Bearer"
    elif path.name in ("local.yaml", "prod.yaml", "vllm-cpu.yaml", "pd-pairs.yaml"):
        args = app_args_from_serve_config(str(path))
        assert args.router.require_keys
    elif path.name == "lora.yaml":
        args = app_args_from_serve_config(str(path))
        assert args.router.require_keys and args.router.lora is not None and args.router.lora.adapters
        assert all(flag in args.engine_args()["mixed"] for flag in ("--enable-lora", "--allow-runtime-lora-updating"))
    else:
        pytest.fail(f"{rel}: a config file no test knows how to validate")


def test_local_config_plans_on_the_simulated_cluster() -> None:
    args = app_args_from_serve_config(str(ROOT / "configs/local.yaml"))
    assert args.engine == "sim" and args.router.host == "127.0.0.1" and args.router.port == 8000
    topology = resolve_topology(args)
    plan = plan_for(args, topology)
    assert validate_plan(plan, topology) == [] and not plan.unplaced and plan.cross_island_tp_groups == 0


def _two_hgx_nodes(tmp_path: Path) -> Topology:
    nodes = []
    for name in ("gpu-node-a", "gpu-node-b"):
        nvml = fake_nvml.hgx_h100()
        root = fake_nvml.write_sysfs(tmp_path / name, nvml, {
            f"mlx5_{i}": (f"0000:{0x19 + 0x10 * i:02x}:00.0", i, "400 Gb/sec (4X NDR)", "InfiniBand")
            for i in range(8)})
        nodes.append(discover(node_name=name, nvml=nvml, sysfs_root=root))
    return Topology(nodes=tuple(nodes))


def test_prod_config_plans_onto_two_hgx_h100_nodes_found_by_nvml(tmp_path: Path) -> None:
    args = app_args_from_serve_config(str(ROOT / "configs/prod.yaml"))
    assert args.engine == "vllm" and args.topology == "nvml"
    topology = resolve_topology(args, discover=lambda: _two_hgx_nodes(tmp_path))
    plan = plan_for(args, topology)
    assert validate_plan(plan, topology) == [] and not plan.unplaced
    by_node: dict[str, list[str]] = {}
    for p in plan.placements:
        by_node.setdefault(p.node, []).append(f"{p.role}:{len(p.gpus)}")
        assert p.tier == "nvlink" and p.in_island
    # each node: one TP=4 prefill and two TP=2 decodes, so every KV handover stays in its island
    assert {n: sorted(v) for n, v in by_node.items()} == {
        n: ["decode:2", "decode:2", "prefill:4"] for n in ("gpu-node-a", "gpu-node-b")}
    with pytest.raises(ParseError, match="topology nvml needs discovery"):
        resolve_topology(args)


def test_app_args_report_every_problem_at_once() -> None:
    with pytest.raises(ParseError) as err:
        parse_app_args({"topology": "x", "engine": "gpu", "pools": [], "router": {"require_keys": True},
                        "colour": "blue"})
    message = str(err.value)
    for where in ("engine", "pools", "router", "colour"):
        assert where in message, message
    with pytest.raises(ParseError, match="simulated engines need a declared topology"):
        parse_app_args({"topology": "nvml", "engine": "sim", "router": {"require_keys": False},
                        "pools": [{"name": "a", "role": "mixed", "tp": 1, "replicas": 1}]})


def _args(**extra: Any) -> dict[str, Any]:
    return {"topology": "configs/clusters/local-sim.yaml", "engine": "sim", "router": {"require_keys": False},
            "pools": [{"name": "mixed", "role": "mixed", "tp": 1, "replicas": 1, "model": "llama-3.1-8b"}], **extra}


CLASSES = [{"name": "fast", "priority": 0, "ttft_ms": 300, "tpot_ms": 30},
           {"name": "slow", "priority": 1, "ttft_ms": 9000, "tpot_ms": 300, "sheddable": True}]


def test_slo_classes_are_declared_once_and_the_other_section_derives_them() -> None:
    placed = parse_app_args(_args(slo_classes=CLASSES))
    assert [c.name for c in placed.router.slo_classes] == ["fast", "slow"]  # admission and routing know them
    routed = _args()
    routed["router"] = {"require_keys": False, "slo_classes": CLASSES}
    assert [c.name for c in parse_app_args(routed).slo_classes] == ["fast", "slow"]  # so does the placement
    for path in ("local", "prod", "vllm-cpu"):  # the shipped configs declare them once
        doc = yaml.safe_load(Path(f"configs/{path}.yaml").read_text())
        assert "slo_classes" not in doc["applications"][0]["args"]["router"]


def test_two_slo_class_declarations_that_disagree_are_an_error_naming_both() -> None:
    both = _args(slo_classes=CLASSES)
    both["router"] = {"require_keys": False, "slo_classes": [{**CLASSES[0], "ttft_ms": 301}, CLASSES[1]]}
    with pytest.raises(ParseError, match=r"args\.slo_classes and args\.router\.slo_classes disagree"):
        parse_app_args(both)
    same = _args(slo_classes=CLASSES)
    same["router"] = {"require_keys": False, "slo_classes": list(reversed(CLASSES))}
    assert len(parse_app_args(same).router.slo_classes) == 2  # the same classes twice: fine
