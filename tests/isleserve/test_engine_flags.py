"""vLLM's tool-calling and reasoning flags from the pool config (issue 30): `vllm:` of the app and
of each pool, given as `vllm serve` takes them, reach a simulated engine's argv (and a vLLM
server's), are refused as vLLM refuses them, and configs/local.yaml turns tool calling on."""

from __future__ import annotations

import argparse
import copy
from typing import Any

import pytest

from control.spec import EngineLaunch
from isleserve.settings import app_args_from_serve_config, parse_app_args
from pools.vllmconfig import VllmAppConfig, VllmPoolConfig, settings_for
from simengine.cli import add_arguments
from tests.conftest import ROOT
from topology.errors import ParseError

pytestmark = pytest.mark.unit
TOOLS = ("--tool-call-parser", "hermes", "--enable-auto-tool-choice")
LOCAL = app_args_from_serve_config(str(ROOT / "configs/local.yaml"))


def _sim_args(argv: list[str]) -> argparse.Namespace:
    """A launch's argv as `python -m pools sim-engine` reads it."""
    assert argv[:3] == ["-m", "pools", "sim-engine"]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv[3:])


def test_local_yaml_starts_every_engine_with_tool_calling() -> None:
    flags = LOCAL.engine_args()
    assert flags == {p.name: TOOLS for p in LOCAL.pools}
    launch = EngineLaunch(replica_id="r", pool="mixed", role="mixed", model="llama-3.1-8b", gpu="h100-sxm", tp=1,
                          node="h100-0", gpus=(0,), topology_source="t.yaml", engine_args=flags["mixed"])
    got = _sim_args(launch.command())
    assert (got.tool_call_parser, got.enable_auto_tool_choice, got.reasoning_parser) == ("hermes", True, None)


def _raw() -> dict[str, Any]:
    return copy.deepcopy(LOCAL.model_dump(mode="json", exclude_none=True))


def test_a_pool_overrides_the_apps_flags() -> None:
    raw = _raw()
    raw["pools"][0]["vllm"] = {"enable_auto_tool_choice": False, "reasoning_parser": "deepseek_r1"}
    flags = parse_app_args(raw).engine_args()
    assert flags[raw["pools"][0]["name"]] == ("--tool-call-parser", "hermes", "--reasoning-parser", "deepseek_r1")
    assert flags[raw["pools"][1]["name"]] == TOOLS


def test_auto_tool_choice_without_a_parser_is_refused_naming_the_pool() -> None:
    raw = _raw()
    raw["vllm"] = {"enable_auto_tool_choice": True}
    with pytest.raises(ParseError, match=r"pools\[0\] \(prefill\): enable_auto_tool_choice needs "
                                         r"tool_call_parser"):
        parse_app_args(raw)


def test_a_vllm_server_gets_the_same_flags_before_its_extra_args() -> None:
    app = VllmAppConfig(tool_call_parser="llama3_json", enable_auto_tool_choice=True, extra_args=["--seed", "1"])
    pool = VllmPoolConfig(model="meta-llama/Llama-3.1-8B-Instruct", reasoning_parser="qwen3")
    assert settings_for(app, pool, None).extra_args == ("--tool-call-parser", "llama3_json",
                                                        "--enable-auto-tool-choice", "--reasoning-parser", "qwen3",
                                                        "--seed", "1")
