"""`engine: vllm` deployed through the controller, as configs/vllm-cpu.yaml says: on a local Ray
cluster (`ray.cluster_utils.Cluster`, loopback) whose worker node carries the config's node `cpu`,
the controller places a prefill and a decode replica, starts both vLLM CPU servers side by side
as pinned replica actors (node affinity and the planned GPU's resource, CUDA_VISIBLE_DEVICES, the
nearest NIC, each on the core its "GPU" stands for, on ports from the config's ranges), and
publishes them; the router follows the table and the openai client gets answers
disaggregated over NIXL. A restarted controller reattaches to the same servers on the same ports.
With the router's `kv_events` set, the controller starts both servers publishing their prefix
caches to it, and the router's expected hits on the prefill replica are vLLM's own.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
import ray
import yaml

from control.actors import get_or_create_controller
from control.discovery import ray_nodes
from isleserve.app import RouterThread, controller_spec
from isleserve.settings import AppArgs, parse_app_args
from pools.pinning import gpu_resource
from router.config import DEV_KEY
from tests.conftest import ROOT
from tests.support.ports import free_ports
from tests.support.raycluster import fake_cluster
from tests.vllm.conftest import READY_TIMEOUT_S, SERVED
from topology import read_source

pytestmark = [pytest.mark.vllm, pytest.mark.ray, pytest.mark.timeout(900)]
CONFIG = ROOT / "configs/vllm-cpu.yaml"
IGNORE_EOS = {"ignore_eos": True}
BLOCK = 32
"""The engines' KV block size with the router's kv_events (vLLM's CPU attention wants a multiple of 32)."""


@dataclass
class Deployed:
    controller: Any
    router: RouterThread
    state_dir: Path
    ray_node: str
    clients: list[openai.OpenAI] = field(default_factory=list)

    def client(self) -> openai.OpenAI:
        self.clients.append(openai.OpenAI(base_url=f"http://127.0.0.1:{self.router.router.port}/v1",
                                          api_key=DEV_KEY, max_retries=0, timeout=120))
        return self.clients[-1]

    def replicas(self) -> dict[str, dict[str, Any]]:
        return dict(ray.get(self.controller.replicas.remote(), timeout=60))


def _args(state_dir: Path) -> AppArgs:
    raw = yaml.safe_load(CONFIG.read_text())["applications"][0]["args"]
    raw.update(state_dir=str(state_dir))
    raw["vllm"]["start_timeout_s"] = READY_TIMEOUT_S
    raw["router"]["port"] = 0
    raw["router"]["kv_events"] = {"endpoint": f"tcp://127.0.0.1:{free_ports(1)[0]}", "block_size": BLOCK}
    return parse_app_args(raw)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    args = _args(tmp_path_factory.mktemp("vllm-controller"))
    engines: list[int] = []
    with fake_cluster(read_source(str(ROOT / args.topology)), ("cpu",), num_gpus=0):
        controller, router = get_or_create_controller(controller_spec(args)), None
        d: Deployed | None = None
        try:
            router = RouterThread(args, controller)  # deploys: both vLLM servers started and healthy
            ray_node = next(n.node_id for n in ray_nodes() if gpu_resource("cpu", 0) in n.resources)
            d = Deployed(controller=controller, router=router, state_dir=Path(args.state_dir), ray_node=ray_node)
            engines = [r["pid"] for r in d.replicas().values()]
            yield d
            engines += [r["pid"] for r in d.replicas().values()]
        finally:
            for c in d.clients if d is not None else []:
                c.close()
            if router is not None:
                router.stop()
            ray.get(controller.shutdown.remote(), timeout=120)
            ray.kill(controller, no_restart=True)
    assert not [pid for pid in engines if pid and _alive(pid)], "vLLM servers left behind"


def test_the_controller_starts_pinned_vllm_replicas_on_their_own_ports(deployed: Deployed) -> None:
    infos = deployed.replicas()
    assert sorted(infos) == ["decode-0", "prefill-0"]
    http, side = set(), set()
    for rid, info in infos.items():
        gpu = 0 if rid == "prefill-0" else 1  # the plan: one "GPU" (core) each
        assert info["engine"] == "vllm" and info["pid"] and info["ray_node_id"] == deployed.ray_node
        assert info["ray_resources"] == {gpu_resource("cpu", gpu): 1.0}
        assert info["env"]["CUDA_VISIBLE_DEVICES"] == str(gpu) and info["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert info["env"]["NCCL_IB_HCA"] == "mlx5_0"  # the nearest NIC, from the plan
        assert info["env"]["UCX_NET_DEVICES"] == "lo"  # the config's extra_env wins over the plan's mlx5_0:1
        if {0, 1} <= os.sched_getaffinity(0):
            assert info["cpu_affinity"] == [gpu]  # the core that "GPU" stands for
        assert 8100 <= info["ports"]["http"] <= 8199 and 5600 <= info["ports"]["side_channel"] <= 5699
        assert info["url"] == f"http://127.0.0.1:{info['ports']['http']}"
        http.add(info["ports"]["http"])
        side.add(info["ports"]["side_channel"])
    assert len(http) == len(side) == 2
    saved = json.loads((deployed.state_dir / "state.json").read_text())["replicas"]
    assert {rid: r["ports"] for rid, r in saved.items()} == {rid: i["ports"] for rid, i in infos.items()}
    logs = sorted(p.name for p in (deployed.state_dir / "vllm-logs").iterdir())
    assert logs == ["decode-0-g0.log", "prefill-0-g0.log"]


def test_the_openai_client_gets_disaggregated_answers_through_the_router(deployed: Deployed) -> None:
    c = deployed.client()
    assert [m.id for m in c.models.list()] == [SERVED]
    raw = c.chat.completions.with_raw_response.create(
        model=SERVED, messages=[{"role": "user", "content": "Which island am I on?"}], max_tokens=8,
        temperature=0.0, seed=0, extra_body=IGNORE_EOS)
    chat = raw.parse()
    assert raw.headers["x-isle-prefill-replica"] == "prefill-0" and raw.headers["x-isle-replica"] == "decode-0"
    assert chat.usage is not None and chat.usage.completion_tokens == 8 and chat.choices[0].message.content
    chunks = list(c.completions.create(model=SERVED, prompt="def route(request):", max_tokens=6, stream=True,
                                       stream_options={"include_usage": True}, temperature=0.0, seed=0,
                                       extra_body=IGNORE_EOS))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices)


def test_a_restarted_controller_reattaches_on_the_same_ports(deployed: Deployed) -> None:
    before = {rid: (r["pid"], r["url"], r["ports"]) for rid, r in deployed.replicas().items()}
    version = ray.get(deployed.controller.table.remote()).version
    ray.kill(deployed.controller, no_restart=False)  # its process dies; Ray starts it again
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if ray.get(deployed.controller.table.remote(), timeout=10).version > version:
                break
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass
        time.sleep(0.5)
    else:
        pytest.fail("the controller did not come back")
    assert {rid: (r["pid"], r["url"], r["ports"]) for rid, r in deployed.replicas().items()} == before
    out = deployed.client().completions.create(model=SERVED, prompt="still there?", max_tokens=2, temperature=0.0)
    assert out.usage is not None and out.usage.completion_tokens >= 1


def _counter(url: str, name: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(name + "_total{"))


def test_the_controllers_vllm_servers_publish_their_caches_to_the_router(deployed: Deployed) -> None:
    router = deployed.router.router
    assert router.kvindex is not None
    table = {r.replica_id: r for r in router.replicas.table.replicas}
    assert all(r.engine == "vllm" and r.kv_events and not r.kv_events_replay for r in table.values())
    prefill = deployed.replicas()["prefill-0"]["url"]
    c = deployed.client()
    system = "You keep the lighthouse logbook and answer in one short line. " * 12  # several blocks of 32
    before = _counter(prefill, "vllm:prefix_cache_hits")
    for question in ("When was the lamp last cleaned?", "Who relieved the keeper in March?"):
        raw = c.chat.completions.with_raw_response.create(
            model=SERVED, messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
            max_tokens=2, temperature=0.0, extra_body=IGNORE_EOS)
        assert raw.headers["x-isle-prefill-replica"] == "prefill-0"
        deadline = time.monotonic() + 10
        while router.kvindex.index.blocks("prefill-0") == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
    hits = _counter(prefill, "vllm:prefix_cache_hits") - before
    assert router.kvindex.index.blocks("prefill-0") >= 4  # the system prompt's blocks, from vLLM's own events
    assert hits >= 4 * BLOCK  # the second chat read the shared system prompt from prefill-0's cache
    view = router.kvindex.per_replica()["prefill-0"]
    assert view["hit_tokens"] == hits  # the router expected exactly what vLLM counted
