"""The vLLM launcher without vLLM: the command line and environment for every role and TP size
(pinning from a real machine template), and fake engines that die, hang, serve or ignore SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from control.replicas.vllm.command import VllmServer, command, environment, from_launch
from control.replicas.vllm.process import EngineStartError, VllmProcess, free_port
from control.replicas.vllm.replica import VllmReplica, busy_requests
from control.spec import EngineLaunch
from pools.model import PlacementRequest, PoolSpec, ReplicaPlacement
from pools.pinning import pin_for
from pools.placement import get_policy
from tests.support.wait import wait_until
from topology import read_source

pytestmark = pytest.mark.integration

HGX = read_source("hgx-h100")
MODEL = "meta-llama/Llama-3.1-70B-Instruct"


def _placement(role: str, tp: int) -> ReplicaPlacement:
    pool = PoolSpec(name=f"{role}-tp{tp}", role=role, tp=tp, replicas=1, model="llama-3.1-8b")  # type: ignore[arg-type]
    plan = get_policy("island-aligned").place(PlacementRequest(topology=HGX, pools=(pool,)))
    assert plan.placements, plan.unplaced
    return plan.placements[0]


def _launch(role: str, tp: int, generation: int = 0) -> EngineLaunch:
    p = _placement(role, tp)
    return EngineLaunch(replica_id=p.replica_id, pool=p.pool, role=role, model="llama-3.1-8b", gpu="h100-sxm", tp=tp,
                        node=p.node, gpus=p.gpus, topology_source="hgx-h100", pin=pin_for(HGX, p, None, {}),
                        generation=generation)


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.unit
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("role", ["prefill", "decode", "mixed"])
def test_command_and_environment_for_every_role_and_tp(role: str, tp: int) -> None:
    launch = _launch(role, tp, generation=3)
    side = None if role == "mixed" else 5600
    server = from_launch(launch, model=MODEL, port=8100, side_channel_port=side, served_model_name="llama-70b",
                         host_ip="10.0.0.7", max_model_len=8192)
    argv = command(server, "/opt/vllm/bin/python")
    assert argv[:3] == ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert _flag(argv, "--model") == MODEL and _flag(argv, "--served-model-name") == "llama-70b"
    assert _flag(argv, "--tensor-parallel-size") == str(tp) and _flag(argv, "--port") == "8100"
    assert _flag(argv, "--scheduling-policy") == "priority" and _flag(argv, "--max-model-len") == "8192"
    env = environment(server)
    gpus = env["CUDA_VISIBLE_DEVICES"].split(",")
    assert len(gpus) == tp and sorted(int(g) for g in gpus) == sorted(launch.gpus)
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and env["VLLM_HOST_IP"] == "10.0.0.7"
    nics = launch.pin.env["NCCL_IB_HCA"].split(",")  # the nearest rails of an HGX H100: one per GPU pair
    assert nics and all(n.startswith("mlx5_ib") for n in nics)
    assert env["NCCL_IB_HCA"] == ",".join(nics) and env["UCX_NET_DEVICES"] == ",".join(f"{n}:1" for n in nics)
    if role == "mixed":
        assert "--kv-transfer-config" not in argv
        assert not {"VLLM_NIXL_SIDE_CHANNEL_PORT", "VLLM_NIXL_SIDE_CHANNEL_HOST"} & set(env)
    else:
        kv = json.loads(_flag(argv, "--kv-transfer-config"))
        kv_role = {"prefill": "kv_producer", "decode": "kv_consumer"}[role]
        assert kv == {"kv_connector": "NixlConnector", "kv_role": kv_role, "engine_id": f"{launch.replica_id}-g3"}
        assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600" and env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.7"
    assert server.cpus == launch.pin.cpus and server.cpus  # the GPUs' NUMA CPUs


@pytest.mark.unit
def test_cpu_backend_options() -> None:
    server = VllmServer(replica_id="d1", model="/models/tiny", served_model_name="tiny", port=8001, role="decode",
                        side_channel_port=5610, kv_buffer_device="cpu", cpu_threads_bind="1", enforce_eager=True,
                        kv_cache_memory_bytes=64 << 20, offline=True, extra_args=("--seed", "7"),
                        extra_env={"UCX_TLS": "tcp,self,sm"}, engine_id="d1-run2")
    argv = command(server, "python")
    assert json.loads(_flag(argv, "--kv-transfer-config"))["kv_buffer_device"] == "cpu"
    assert json.loads(_flag(argv, "--kv-transfer-config"))["engine_id"] == "d1-run2"
    assert "--enforce-eager" in argv and _flag(argv, "--kv-cache-memory-bytes") == str(64 << 20)
    assert argv[-2:] == ["--seed", "7"] and "--max-model-len" not in argv
    env = environment(server)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1" and env["HF_HUB_OFFLINE"] == "1" and env["UCX_TLS"] == "tcp,self,sm"
    assert "CUDA_VISIBLE_DEVICES" not in env  # the CPU backend has no GPUs to pin
    assert VllmServer(replica_id="w", model="m", served_model_name="m", port=9, host="0.0.0.0").url == \
        "http://127.0.0.1:9"


@pytest.mark.unit
def test_bad_specs_name_every_problem() -> None:
    with pytest.raises(ValueError) as err:
        VllmServer(replica_id="p9", model="m", served_model_name="m", port=0, role="prefill", tp=2,
                   pin_env={"CUDA_VISIBLE_DEVICES": "0,1,2"})
    text = str(err.value)
    assert text.startswith("vLLM replica p9:") and "port is 0" in text and "needs a NIXL side_channel_port" in text
    assert "CUDA_VISIBLE_DEVICES=0,1,2 holds 3 GPUs for tp 2" in text
    with pytest.raises(ValueError, match="side_channel_port 8000 is the HTTP port"):
        VllmServer(replica_id="d", model="m", served_model_name="m", port=8000, role="decode", side_channel_port=8000)


# fake engines: an executable that stands in for the vLLM environment's python ---------------
FAKE = """#!{python}
import http.server, os, signal, subprocess, sys, time
mode, argv = os.environ["FAKE_MODE"], sys.argv[1:]
port = int(argv[argv.index("--port") + 1])
for i in range(60):
    print(f"fake engine line {{i}}")
sys.stdout.flush()
if mode == "die":
    print("RuntimeError: Failed to infer device type", flush=True)
    sys.exit(3)
if mode == "hang":
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(os.environ["FAKE_CHILD"], "w").write(str(child.pid))
    time.sleep(600)
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass

print("Application startup complete.", flush=True)
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[Callable[..., VllmProcess]]:
    exe = tmp_path / "fake-python"
    exe.write_text(FAKE.format(python=sys.executable))
    exe.chmod(0o755)
    started: list[VllmProcess] = []

    def make(mode: str, timeout_s: float = 20.0, **env: str) -> VllmProcess:
        server = VllmServer(replica_id=f"fake-{mode}", model="/models/none", served_model_name="none",
                            port=free_port(), role="decode", side_channel_port=free_port(),
                            pin_env={"CUDA_VISIBLE_DEVICES": "3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
                            extra_env={"FAKE_MODE": mode, **env})
        proc = VllmProcess(server, str(exe), log_path=tmp_path / f"{mode}.log", ready_timeout_s=timeout_s)
        started.append(proc)
        return proc

    yield make
    for proc in started:
        proc.stop(grace_s=1.0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "zombie" not in status.read_text()


@pytest.mark.integration
def test_an_engine_that_dies_at_start_says_why_with_its_last_lines(fake: Callable[..., VllmProcess]) -> None:
    proc = fake("die")
    with pytest.raises(EngineStartError) as err:
        proc.start()
    text = str(err.value)
    assert err.value.exit_code == 3 and "fake-die: the engine exited with code 3" in text
    assert text.rstrip().endswith("| RuntimeError: Failed to infer device type")
    assert "fake engine line 59" in text and "fake engine line 0\n" not in text  # only the tail
    assert len(err.value.tail) == 40


@pytest.mark.integration
def test_an_engine_that_never_answers_times_out_and_is_stopped_with_its_children(
        fake: Callable[..., VllmProcess], tmp_path: Path) -> None:
    child_file = tmp_path / "child.pid"
    proc = fake("hang", timeout_s=1.5, FAKE_CHILD=str(child_file))
    with pytest.raises(EngineStartError, match=r"did not answer within 1.5 s \(the engine was stopped\)") as err:
        proc.start()
    assert "fake engine line 59" in str(err.value)
    assert not proc.running() and not _alive(int(child_file.read_text()))


@pytest.mark.integration
def test_a_healthy_engine_gets_its_environment_streams_its_log_and_stops(
        fake: Callable[..., VllmProcess], tmp_path: Path) -> None:
    proc = fake("serve")
    assert proc.start() == proc.url and proc.healthy()
    assert proc.pid is not None
    environ = dict(item.split("=", 1) for item in Path(f"/proc/{proc.pid}/environ").read_text().split("\0") if item)
    assert environ["CUDA_VISIBLE_DEVICES"] == "3" and environ["VLLM_HOST_IP"] == "127.0.0.1"
    assert environ["VLLM_NIXL_SIDE_CHANNEL_PORT"] == str(proc.server.side_channel_port)
    assert proc.stop() == -15 and not proc.running() and not proc.healthy()
    assert "Application startup complete." in (tmp_path / "serve.log").read_text()
    assert proc.tail()[-1] == "Application startup complete."


@pytest.mark.integration
def test_an_engine_that_ignores_sigterm_is_killed(fake: Callable[..., VllmProcess]) -> None:
    proc = fake("stubborn")
    proc.start()
    assert proc.stop(grace_s=1.0) == -9 and not proc.running()


@pytest.mark.unit
def test_busy_requests_reads_vllm_gauges() -> None:
    text = ('# HELP vllm:num_requests_running x\nvllm:num_requests_running{model_name="m"} 2.0\n'
            'vllm:num_requests_waiting{model_name="m"} 1.0\nvllm:kv_cache_usage_perc{model_name="m"} 0.5\n')
    assert busy_requests(text) == 3.0 and busy_requests("") == 0.0


@pytest.mark.integration
def test_a_dead_engine_is_restarted_as_a_new_kv_peer(fake: Callable[..., VllmProcess], tmp_path: Path) -> None:
    server = fake("serve").server
    replica = VllmReplica(server, str(tmp_path / "fake-python"), log_dir=str(tmp_path), ready_timeout_s=20)
    try:
        assert replica.start() == server.url and replica.healthy() and replica.ensure() == server.url
        first = replica.info()
        assert first["pid"] and first["env"]["CUDA_VISIBLE_DEVICES"] == "3" and first["restarts"] == 0
        os.kill(first["pid"], signal.SIGKILL)
        replica.process.proc.wait()  # type: ignore[union-attr]
        assert not replica.healthy() and replica.idle()  # a dead engine holds no request
        assert replica.ensure() == server.url and replica.healthy()
        again = replica.info()
        assert again["restarts"] == 1 and again["pid"] != first["pid"]
        assert again["kv_engine_id"].startswith(f"{server.kv_engine_id}-r1-")
    finally:
        replica.stop()
    assert not replica.process.running()


HOLDER = """
import sys, time
from pathlib import Path
from control.replicas.vllm.command import VllmServer
from control.replicas.vllm.process import VllmProcess, free_port
server = VllmServer(replica_id="fake-held", model="/models/none", served_model_name="none", port=free_port(),
                    role="decode", side_channel_port=free_port(), extra_env={"FAKE_MODE": "serve"})
proc = VllmProcess(server, sys.argv[1], log_path=Path(sys.argv[2]), ready_timeout_s=20.0, die_with_starter=True)
proc.start()
print(proc.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.integration
def test_an_engine_stops_when_the_process_that_started_it_is_killed(tmp_path: Path) -> None:
    """A replica actor killed outright (SIGKILL: no stop()) takes its vLLM server with it."""
    import subprocess

    exe = tmp_path / "fake-python"
    exe.write_text(FAKE.format(python=sys.executable))
    exe.chmod(0o755)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(exe), str(tmp_path / "held.log")],
                              stdout=subprocess.PIPE, text=True)
    engine = 0
    try:
        assert holder.stdout is not None
        engine = int(holder.stdout.readline())
        assert _alive(engine)
        holder.kill()
        holder.wait(10)
        wait_until(lambda: not _alive(engine), 15, "the engine gone with the process that started it",
                   interval_s=0.1)
    finally:
        holder.kill()
        holder.wait(10)
        if holder.stdout is not None:
            holder.stdout.close()
        if engine and _alive(engine):  # the orphan a failure leaves
            os.killpg(engine, signal.SIGKILL)


@pytest.mark.integration
def test_by_default_an_engine_outlives_the_pool_thread_that_started_it(fake: Callable[..., VllmProcess]) -> None:
    """The controller starts vLLM servers from a thread pool that ends after the launch."""
    import threading
    import time

    proc = fake("serve")
    starter = threading.Thread(target=proc.start)
    starter.start()
    starter.join(30)
    time.sleep(1.0)
    assert proc.running() and proc.healthy()
