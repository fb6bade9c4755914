"""A gang replica on a fake two-node Ray cluster (`ray.cluster_utils.Cluster`, loopback only):
an expert-parallel qwen3-30b-a3b gang, tp=1 dp=4, across two 2-GPU nodes, one simulated engine
per data-parallel rank, each published as a rank endpoint and answering on its own URL; one
rank's engine killed restarts the whole gang (every rank a new generation), which then serves
again; nothing is left running afterwards."""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import ray

from control.actors import get_or_create_controller
from pools.model import PoolSpec
from pools.routing import RoutingTable
from tests.conftest import ROOT
from tests.control.conftest import ALL_CLASSES, controller_spec
from tests.control.test_controller_cluster import _alive
from tests.support.raycluster import fake_cluster
from tests.support.wait import START_S, wait_until
from topology import read_source

pytestmark = [pytest.mark.integration, pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(600)]  # START_S
MODEL = "qwen3-30b-a3b"
RANKS = [f"moe-0-dp{k}" for k in range(4)]


@dataclass
class Gang:
    controller: Any
    state_dir: Path

    def table(self) -> RoutingTable:
        table: RoutingTable = ray.get(self.controller.table.remote(), timeout=30)
        return table

    def key(self) -> str:
        """The engines' key (vLLM's --api-key), as the router gets it."""
        return str(ray.get(self.controller.engine_api_key.remote(), timeout=30))

    def ranks(self) -> dict[str, dict[str, Any]]:
        return dict(ray.get(self.controller.replicas.remote(), timeout=30)["moe-0"]["ranks"])

    def events(self, kind: str) -> list[dict[str, Any]]:
        lines = (self.state_dir / "events.jsonl").read_text().splitlines()
        return [e for e in map(json.loads, lines) if e["kind"] == kind]


def _topology(directory: Path) -> str:
    """Two nodes of two GPUs each (the CPU tier's pair, as L40S): a 4-rank gang spans both."""
    capture = ROOT / "configs/clusters/cpu-pair.txt"
    path = directory / "two-pairs.yaml"
    path.write_text("name: two-pairs\nfabric: {technology: ib-hdr}\nnodes:\n"
                    + "".join(f"  - {{name: {n}, capture: {capture}, gpu: l40s}}\n" for n in ("a", "b")))
    return str(path)


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gang]:
    directory = tmp_path_factory.mktemp("gang")
    source = _topology(directory)
    spec = controller_spec(directory / "state", PoolSpec(name="moe", role="mixed", tp=1, dp=4, replicas=1, model=MODEL,
                                                         expert_parallel=True, slo_classes=ALL_CLASSES),
                           source=source)
    engines: list[int] = []
    with fake_cluster(read_source(source), ("a", "b"), num_gpus=2):
        controller = get_or_create_controller(spec)
        try:
            ray.get(controller.deploy.remote(), timeout=START_S)
            gang = Gang(controller=controller, state_dir=Path(spec.state_dir))
            engines = [r["pid"] for r in gang.ranks().values()]
            yield gang
            engines += [r["pid"] for r in gang.ranks().values() if "pid" in r]  # a rank still starting has none
        finally:
            ray.get(controller.shutdown.remote(), timeout=60)
    assert engines and not [pid for pid in engines if pid and _alive(pid)], "engine processes left behind"


def _ask(url: str, key: str) -> int:
    """A chat straight to an engine, with the engines' key (only the router is given it)."""
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=body,
                                 headers={"content-type": "application/json", "authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return int(json.loads(resp.read())["usage"]["completion_tokens"])


def test_each_rank_is_an_endpoint_and_a_dead_rank_restarts_the_whole_gang(deployed: Gang) -> None:
    table = deployed.table()
    assert [(r.replica_id, r.gang, r.dp_rank) for r in table.replicas] == [(rid, "moe-0", k)
                                                                           for k, rid in enumerate(RANKS)]
    assert {r.node for r in table.replicas} == {"a", "b"} and len({r.url for r in table.replicas}) == 4
    assert all(_ask(r.url, deployed.key()) == 4 for r in table.replicas)
    before = deployed.ranks()
    assert [before[rid]["actor"] for rid in RANKS] == [f"isleserve-{rid}-g0" for rid in RANKS]
    assert {before[rid]["ray_node_labels"]["isle.io/node"] for rid in RANKS} == {"a", "b"}
    os.kill(before["moe-0-dp2"]["pid"], signal.SIGKILL)
    old_urls = {before[rid]["url"] for rid in RANKS}

    def restarted() -> RoutingTable | None:
        table = deployed.table()
        return table if all(r.url not in old_urls for r in table.replicas) else None

    # ~10 s alone; two loaded cores (CI's other lanes) have taken 4x that
    table = wait_until(restarted, START_S, "the gang restarted (every rank a new URL)", interval_s=0.5)
    after = deployed.ranks()
    assert [after[rid]["actor"] for rid in RANKS] == [f"isleserve-{rid}-g1" for rid in RANKS]  # all of them
    assert not [rid for rid in RANKS if _alive(before[rid]["pid"])]  # the living ranks were stopped too
    assert all(_ask(r.url, deployed.key()) == 4 for r in table.replicas)
    restart = deployed.events("restart")
    assert restart and "rank moe-0-dp2 is down" in restart[-1]["error"]
