"""vLLM's LoRA flags from the pool config (issue 33): `vllm:` of the app and of each pool reach a
simulated engine's argv as `vllm serve` takes them, and sizes without `enable_lora` are refused."""

from __future__ import annotations

import argparse
import copy

import pytest

from control.spec import EngineLaunch
from isleserve.settings import app_args_from_serve_config, parse_app_args
from pools.vllmconfig import VllmAppConfig, VllmPoolConfig, settings_for
from simengine.cli import add_arguments
from tests.conftest import ROOT
from topology.errors import ParseError

pytestmark = pytest.mark.unit
LOCAL = app_args_from_serve_config(str(ROOT / "configs/local.yaml"))


def test_a_pools_lora_flags_reach_its_simulated_engines() -> None:
    raw = copy.deepcopy(LOCAL.model_dump(mode="json", exclude_none=True))
    name = raw["pools"][0]["name"]
    raw["pools"][0]["vllm"] = {"enable_lora": True, "max_loras": 2, "max_lora_rank": 32,
                               "lora_modules": ["sql=/adapters/sql", "chat=/adapters/chat"],
                               "allow_runtime_lora_updating": True}
    flags = parse_app_args(raw).engine_args()[name]
    launch = EngineLaunch(replica_id="r", pool=name, role="mixed", model="llama-3.1-8b", gpu="h100-sxm", tp=1,
                          node="h100-0", gpus=(0,), topology_source="t.yaml", engine_args=flags)
    argv = launch.command()
    assert argv[:3] == ["-m", "pools", "sim-engine"]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    got = parser.parse_args(argv[3:])
    assert (got.enable_lora, got.max_loras, got.max_lora_rank) == (True, 2, 32)
    assert got.lora_modules == ["sql=/adapters/sql", "chat=/adapters/chat"] and got.allow_runtime_lora_updating


def test_a_vllm_server_gets_the_variable() -> None:
    app = VllmAppConfig(enable_lora=True, allow_runtime_lora_updating=True, extra_env={"A": "b"})
    got = settings_for(app, VllmPoolConfig(model="meta-llama/Llama-3.1-8B-Instruct"), None)
    assert got.extra_env == {"A": "b", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
    assert "--enable-lora" in got.extra_args and "--allow-runtime-lora-updating" not in got.extra_args


def test_lora_sizes_without_enable_lora_are_refused() -> None:
    raw = copy.deepcopy(LOCAL.model_dump(mode="json", exclude_none=True))
    raw["vllm"] = {**raw.get("vllm", {}), "max_loras": 4}
    with pytest.raises(ParseError, match=r"--max-loras need enable_lora"):
        parse_app_args(raw)


def test_configs_lora_yaml_turns_lora_on_for_engines_and_router() -> None:
    app = app_args_from_serve_config(str(ROOT / "configs/lora.yaml"))
    flags = app.engine_args()["mixed"]
    assert flags == ("--enable-lora", "--max-loras", "1", "--allow-runtime-lora-updating")
    assert app.router.lora is not None and [a.name for a in app.router.lora.adapters] == ["sql", "chat", "math"]
