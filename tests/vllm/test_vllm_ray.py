"""A real vLLM replica as the controller places one: a Ray actor on a fake Ray node (a
`ray.cluster_utils.Cluster` node declaring the labels and per-GPU resources of node `a` of the
tests' pairs cluster), pinned by the controller's pinning, starting vLLM through the launcher;
the openai client reaches it through the router."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
import ray
from ray.cluster_utils import Cluster

from pools.controller.discovery import ray_nodes
from pools.controller.pinning import Pin, gpu_resource, pin_for
from pools.controller.spec import EngineLaunch
from pools.model import ReplicaPlacement
from pools.nodelabels import node_labels, node_resources
from pools.vllm import VllmServer, free_port, from_launch
from pools.vllm.replica import remote_replica
from router.config import DEV_KEY
from tests.conftest import ROOT
from tests.vllm.conftest import MODEL_DIR, PYTHON, READY_TIMEOUT_S, SERVED, router_config, start_router
from topology import read_source

pytestmark = [pytest.mark.timeout(900), pytest.mark.ray]
PAIRS = str(ROOT / "tests/data/pairs-cluster.yaml")


@dataclass
class Placed:
    actor: Any
    server: VllmServer
    pin: Pin


def _server(pin: Pin) -> VllmServer:
    """The replica the controller would launch for GPU 1 of node a, on the CPU backend."""
    launch = EngineLaunch(replica_id="mixed-0", pool="mixed", role="mixed", model="llama-3.1-8b", gpu="a30", tp=1,
                          node="a", gpus=(1,), topology_source=PAIRS, pin=pin)
    return from_launch(launch, model=str(MODEL_DIR), port=free_port(), served_model_name=SERVED, max_model_len=1024,
                       cpu_threads_bind="0", enforce_eager=True, kv_cache_memory_bytes=64 << 20, offline=True)


@pytest.fixture(scope="module")
def placed(log_dir: Path) -> Iterator[Placed]:
    topology = read_source(PAIRS)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                             "node_ip_address": "127.0.0.1"})
    node = topology.node("a")
    cluster.add_node(num_cpus=1, num_gpus=0, node_ip_address="127.0.0.1", labels=node_labels(topology, node),
                     resources=node_resources(topology, node))
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level=logging.ERROR, log_to_driver=False)
    actor = None
    try:
        ray_node = next(n for n in ray_nodes() if gpu_resource("a", 1) in n.resources)
        placement = ReplicaPlacement(replica_id="mixed-0", pool="mixed", role="mixed", node="a", gpus=(1,),
                                     island="a/island0", tier="nvlink", in_island=True)
        pin = pin_for(topology, placement, ray_node.node_id, ray_node.resources)
        server = _server(pin)
        actor = remote_replica(server, str(PYTHON), name="isleserve-mixed-0-g0", namespace="isleserve-vllm-test",
                               resources=dict(pin.resources), ray_node_id=pin.ray_node_id, log_dir=str(log_dir),
                               ready_timeout_s=READY_TIMEOUT_S)
        assert ray.get(actor.start.remote(), timeout=READY_TIMEOUT_S + 60) == server.url
        yield Placed(actor=actor, server=server, pin=pin)
    finally:
        if actor is not None:
            ray.get(actor.stop.remote(), timeout=60)
            ray.kill(actor, no_restart=True)
        ray.shutdown()
        cluster.shutdown()  # type: ignore[no-untyped-call]


def test_a_vllm_replica_actor_runs_pinned_on_its_node_and_serves_through_the_router(
        placed: Placed, log_dir: Path) -> None:
    info = ray.get(placed.actor.info.remote(), timeout=30)
    assert info["engine"] == "vllm" and info["pid"] and info["ray_node_id"] == placed.pin.ray_node_id
    assert info["ray_resources"] == {gpu_resource("a", 1): 1.0}
    assert info["env"]["CUDA_VISIBLE_DEVICES"] == "1" and info["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert info["env"]["NCCL_IB_HCA"] == "mlx5_0" and info["env"]["UCX_NET_DEVICES"] == "mlx5_0:1"
    assert ray.get(placed.actor.healthy.remote(), timeout=30) and ray.get(placed.actor.idle.remote(), timeout=30)
    with start_router(router_config([placed.server]), log_dir) as router:
        c = openai.OpenAI(base_url=router.url, api_key=DEV_KEY, max_retries=0, timeout=120)
        raw = c.chat.completions.with_raw_response.create(model=SERVED, messages=[{"role": "user", "content": "hi"}],
                                                          max_tokens=5, temperature=0.0,
                                                          extra_body={"ignore_eos": True})
        assert raw.headers["x-isle-replica"] == "mixed-0"
        chat = raw.parse()
        assert chat.usage is not None and chat.usage.completion_tokens == 5
