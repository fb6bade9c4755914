"""Autoscaling with real vLLM servers on CPU: configs/vllm-cpu.yaml's cluster (one node whose two
"GPUs" are the two cores) with one mixed pool of the tiny Llama that autoscales between one and
two replicas. Concurrent requests from the openai client make the controller start a second vLLM
server on the free core (its own ports, pinned like the first); without load it is drained and
its server process stops, and every request gets its whole answer."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import ray
import yaml

from control.actors import get_or_create_controller
from isleserve.app import RouterThread, controller_spec
from isleserve.settings import AppArgs, parse_app_args
from tests.conftest import ROOT
from tests.support.raycluster import fake_cluster
from tests.vllm.conftest import READY_TIMEOUT_S, SERVED
from tests.vllm.test_vllm_controller import CONFIG, IGNORE_EOS, Deployed, _alive
from topology import read_source

pytestmark = [pytest.mark.vllm, pytest.mark.ray, pytest.mark.timeout(900)]


def _args(state_dir: Path) -> AppArgs:
    raw = yaml.safe_load(CONFIG.read_text())["applications"][0]["args"]
    pool = dict(raw["pools"][1], name="chat", role="mixed", replicas=1,
                autoscaling={"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 1,
                             "upscale_delay_s": 0, "downscale_delay_s": 8, "cooldown_s": 2,
                             "sizing_slo_share": None})
    raw.update(state_dir=str(state_dir), pools=[pool],
               autoscaling={"interval_s": 1, "look_back_s": 3, "window_s": 20, "drain_timeout_s": 120})
    raw["vllm"]["start_timeout_s"] = READY_TIMEOUT_S
    raw["router"]["port"] = 0
    raw["router"]["pd"] = {"enabled": False}
    return parse_app_args(raw)


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    args = _args(tmp_path_factory.mktemp("vllm-autoscale"))
    with fake_cluster(read_source(str(ROOT / args.topology)), ("cpu",), num_gpus=0):
        controller, router = get_or_create_controller(controller_spec(args)), None
        d: Deployed | None = None
        try:
            router = RouterThread(args, controller)
            d = Deployed(controller=controller, router=router, state_dir=Path(args.state_dir), ray_node="")
            yield d
        finally:
            for c in d.clients if d is not None else []:
                c.close()
            if router is not None:
                router.stop()
            ray.get(controller.shutdown.remote(), timeout=120)
            ray.kill(controller, no_restart=True)


def _pool(d: Deployed) -> dict[str, Any]:
    return dict(ray.get(d.controller.plan.remote(), timeout=60)["controller"]["autoscaling"]["pools"]["chat"])


def test_a_second_vllm_server_starts_under_load_and_stops_after_it(deployed: Deployed) -> None:
    client = deployed.client()
    assert _pool(deployed)["placed"] == 1
    stop, errors, done = threading.Event(), [], []

    def load(i: int) -> None:
        while not stop.is_set():
            try:
                out = client.completions.create(model=SERVED, prompt=f"count with me {i}", max_tokens=96,
                                                extra_body=IGNORE_EOS)
                assert out.usage is not None and out.usage.completion_tokens == 96
                done.append(i)
            except BaseException as err:
                errors.append(err)
                return

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(load, i) for i in range(4)]
        deadline = time.monotonic() + READY_TIMEOUT_S
        try:
            while _pool(deployed)["serving"] < 2 and time.monotonic() < deadline and not errors:
                time.sleep(1)
        finally:
            stop.set()
            for f in futures:
                f.result(timeout=180)
    assert not errors, errors[:3]
    assert _pool(deployed)["serving"] == 2 and done
    infos = dict(ray.get(deployed.controller.replicas.remote(), timeout=60))
    assert sorted(infos) == ["chat-0", "chat-1"]
    ports = {rid: info["ports"]["http"] for rid, info in infos.items()}
    assert len(set(ports.values())) == 2 and {infos[r]["env"]["CUDA_VISIBLE_DEVICES"] for r in infos} == {"0", "1"}
    pid = {rid: info["pid"] for rid, info in infos.items()}
    deadline = time.monotonic() + 120
    while _pool(deployed)["placed"] > 1 and time.monotonic() < deadline:
        time.sleep(1)
    assert _pool(deployed)["placed"] == 1
    left = next(iter(ray.get(deployed.controller.replicas.remote(), timeout=60)))
    gone = next(rid for rid in pid if rid != left)
    deadline = time.monotonic() + 60
    while _alive(pid[gone]) and time.monotonic() < deadline:
        time.sleep(1)
    assert not _alive(pid[gone]), "the scaled-in vLLM server still runs"
    out = client.completions.create(model=SERVED, prompt="still here?", max_tokens=8, extra_body=IGNORE_EOS)
    assert out.usage is not None and out.usage.completion_tokens == 8
