"""`engine: vllm` in a Serve config: the per-pool vLLM settings (validated with every problem at
once, app defaults under each pool's own, paths resolved), the port ranges, and the server a
planned replica gets from them (command line and environment, no vLLM needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from control.replicas.vllm.command import command, environment
from control.replicas.vllm.launch import cpu_threads_bind, server_for
from control.spec import EngineLaunch, VllmLaunch
from isleserve.app import controller_spec
from isleserve.settings import app_args_from_serve_config, parse_app_args
from pools.ports import EnginePorts, NoFreePort, PortPlan, PortRange, allocate
from pools.vllmconfig import VllmSettings
from tests.conftest import ROOT
from topology.errors import ParseError

pytestmark = pytest.mark.unit


def _args(**over: Any) -> dict[str, Any]:
    raw = yaml.safe_load((ROOT / "configs/vllm-cpu.yaml").read_text())["applications"][0]["args"]
    raw.update(over)
    return raw  # type: ignore[no-any-return]


def _pool(name: str, role: str, vllm: dict[str, Any] | None) -> dict[str, Any]:
    pool: dict[str, Any] = {"name": name, "role": role, "tp": 1, "replicas": 1, "model": "tiny-llama"}
    if vllm is not None:
        pool["vllm"] = vllm
    return pool


def test_every_problem_of_the_vllm_settings_at_once() -> None:
    raw = _args(vllm={"python": "/opt/v/bin/python", "venv": "/opt/v", "ports": {"http": [9000, 8000]}},
                pools=[_pool("prefill", "prefill", {"extra_args": ["--port=9", "--tensor-parallel-size", "2"],
                                                    "extra_env": {"CUDA_VISIBLE_DEVICES": "3"}}),
                       _pool("decode", "decode", {"max_model_len": 0, "dtype": "int3"})])
    with pytest.raises(ParseError) as err:
        parse_app_args(raw)
    message = str(err.value)
    for expected in ("give python ('/opt/v/bin/python') or venv ('/opt/v'), not both",
                     "vllm.ports: Value error, port range 9000-8000",
                     "pools[0].vllm.extra_args: Value error, --port, --tensor-parallel-size set by the controller",
                     "pools[0].vllm.extra_env: Value error, CUDA_VISIBLE_DEVICES set by the controller",
                     "pools[1].vllm.max_model_len", "pools[1].vllm.dtype"):
        assert expected in message, message
    assert "\n" not in message


def test_a_vllm_pool_needs_a_model_and_overlapping_port_ranges_are_refused() -> None:
    raw = _args(vllm={}, pools=[_pool("prefill", "prefill", None), _pool("decode", "decode", {"dtype": "auto"})])
    with pytest.raises(ParseError, match=r"pools\[0\] \(prefill\): engine vllm needs vllm.model .*; "
                                         r"pools\[1\] \(decode\): engine vllm needs vllm.model"):
        parse_app_args(raw)
    assert parse_app_args(_args(engine="sim", vllm={}, topology="configs/clusters/local-sim.yaml",
                                pools=[_pool("mixed", "mixed", None)]))  # sim engines need none
    with pytest.raises(ParseError, match="HTTP ports 5600-5699 and the NIXL side-channel ports 5650-5750 overlap"):
        parse_app_args(_args(vllm={"model": "m", "ports": {"http": [5600, 5699], "side_channel": [5650, 5750]}}))


def test_pool_settings_override_the_apps_and_relative_paths_resolve(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "venvs/v").mkdir(parents=True)
    (tmp_path / "models/m").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    raw = _args(state_dir=str(tmp_path / "state"),
                vllm={"venv": "venvs/v", "model": "models/m", "max_model_len": 2048, "extra_args": ["--a"],
                      "extra_env": {"X": "1", "Y": "app"}, "start_timeout_s": 30},
                pools=[_pool("prefill", "prefill", {"python": "/usr/bin/python3", "extra_args": ["--b"],
                                                    "extra_env": {"Y": "pool"}, "dtype": "bfloat16"}),
                       _pool("decode", "decode", {"model": "org/remote-model", "served_model_name": "served"})])
    spec = controller_spec(parse_app_args(raw))
    prefill, decode = spec.vllm["prefill"], spec.vllm["decode"]
    assert prefill == VllmSettings(model=str(tmp_path / "models/m"), served_model_name="tiny-llama",
                                   python="/usr/bin/python3", max_model_len=2048, dtype="bfloat16",
                                   extra_args=("--a", "--b"), extra_env={"X": "1", "Y": "pool"}, start_timeout_s=30,
                                   log_dir=str(tmp_path / "state/vllm-logs"))
    assert decode.python == str(tmp_path / "venvs/v") + "/bin/python"
    assert decode.model == "org/remote-model" and decode.served_model_name == "served"  # a hub id stays as is
    assert spec.ports == PortPlan() and spec.engine == "vllm"


def test_the_shipped_vllm_configs_give_every_pool_its_server() -> None:
    cpu = controller_spec(app_args_from_serve_config(str(ROOT / "configs/vllm-cpu.yaml")))
    assert set(cpu.vllm) == {"prefill", "decode"} and all(s.cpu_backend for s in cpu.vllm.values())
    # the vLLM environment resolves against the repository once `make vllm-env` built it (a clean
    # clone has none yet: the launcher then reports the missing interpreter by that name)
    built = (ROOT / ".venv-vllm").exists()
    assert cpu.vllm["decode"].python == (str(ROOT / ".venv-vllm/bin/python") if built else ".venv-vllm/bin/python")
    prod = controller_spec(app_args_from_serve_config(str(ROOT / "configs/prod.yaml")))
    assert {s.served_model_name for s in prod.vllm.values()} == {"llama-3.1-70b"}
    assert prod.vllm["prefill"].python == "" and prod.bench.on_change  # the replica's own Python


def test_ports_lowest_free_per_node_side_channel_for_pd_roles_only() -> None:
    plan = PortPlan(http=PortRange(first=8100, last=8102), side_channel=PortRange(first=5600, last=5601))
    assert allocate(plan, "a", set(), side_channel=False) == EnginePorts(http=8100)
    assert allocate(plan, "a", {8100, 5600}, side_channel=True) == EnginePorts(http=8101, side_channel=5601)
    with pytest.raises(NoFreePort, match="node a: every NIXL side-channel port of 5600-5601 is taken"):
        allocate(plan, "a", {5600, 5601}, side_channel=True)
    with pytest.raises(ValueError, match="want 1024 <= first <= last <= 65535"):
        PortRange(first=80, last=90)
    assert EnginePorts.from_json(EnginePorts(http=1, side_channel=2).to_json()) == EnginePorts(http=1, side_channel=2)


def _launch(role: str, tp: int, cpu_backend: bool, gpu_cpus: tuple[str, ...]) -> EngineLaunch:
    settings = VllmSettings(model="/models/m", served_model_name="m", python="/v/bin/python", max_model_len=512,
                            dtype="auto", extra_args=("--enforce-eager",), extra_env={"UCX_TLS": "tcp"},
                            cpu_backend=cpu_backend)
    ports = EnginePorts(http=8101, side_channel=None if role == "mixed" else 5602)
    return EngineLaunch(replica_id="r-0", pool="p", role=role, model="tiny-llama", gpu="l40s", tp=tp, node="n",
                        gpus=tuple(range(tp)), topology_source="x", generation=2,
                        vllm=VllmLaunch(settings=settings, ports=ports, gpu_cpus=gpu_cpus))


@pytest.mark.parametrize("role", ["prefill", "decode", "mixed"])
def test_a_planned_replica_gets_its_ports_settings_and_thread_binding(role: str) -> None:
    server = server_for(_launch(role, 2, True, ("0-3", "4-7")), host_ip="10.0.0.5")
    argv, env = command(server, "/v/bin/python"), environment(server)
    flags = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert flags["--port"] == "8101" and flags["--host"] == "10.0.0.5" and flags["--dtype"] == "auto"
    assert flags["--served-model-name"] == "m" and flags["--max-model-len"] == "512"
    assert argv[-1] == "--enforce-eager" and server.url == "http://10.0.0.5:8101"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-3|4-7" and env["UCX_TLS"] == "tcp"
    assert env.get("VLLM_NIXL_SIDE_CHANNEL_PORT") == (None if role == "mixed" else "5602")
    assert server.kv_engine_id == "r-0-g2"


def test_thread_binding_only_when_every_rank_has_its_cpus() -> None:
    assert cpu_threads_bind(("0",), 1) == "0" and cpu_threads_bind(("0", ""), 2) is None
    assert cpu_threads_bind(("0",), 2) is None
    gpu = server_for(_launch("mixed", 1, False, ("0",)), host_ip="10.0.0.5")
    assert "VLLM_CPU_OMP_THREADS_BIND" not in environment(gpu)
