"""The controller on a fake multi-node Ray cluster (`ray.cluster_utils.Cluster`): a head without
GPUs and two 4-GPU nodes that declare the labels and per-GPU resources `python -m pools
node-labels` gives them (node b deliberately misses one label). Simulated engines; the router
runs in this process following the controller's table, and the openai client talks to it.

Stated bound (README): interactive traffic stops going to a replica whose TP link was marked
unhealthy within 10 s of the mark (the router follows the table every second; the controller
publishes the drained table before it starts the replacement).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
import ray
import yaml
from openai.types.chat import ChatCompletionMessageParam

from control.actors import get_or_create_controller
from control.discovery import ray_nodes
from control.nodecheck import NODE_LABEL
from isleserve.app import RouterThread, controller_spec
from isleserve.settings import AppArgs, parse_app_args
from router.config import DEV_ADMIN_KEY, DEV_KEY
from tests.conftest import ROOT
from tests.support.raycluster import fake_cluster
from tests.support.wait import START_S, wait_until
from topology import read_source

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(600)]  # past START_S waits on a loaded machine
PAIRS = str(ROOT / "tests/data/pairs-cluster.yaml")
DRAIN_BOUND_S = 10.0


@dataclass
class Product:
    controller: Any
    router: RouterThread
    ray_ids: dict[str, str]
    """Topology node -> Ray node id."""
    state_dir: Path
    address: str
    clients: list[openai.OpenAI] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.router.router.port}"

    def client(self) -> openai.OpenAI:
        """An openai client, closed at teardown (the router's listener then has no open connection)."""
        self.clients.append(openai.OpenAI(base_url=f"{self.base}/v1", api_key=DEV_KEY, max_retries=0, timeout=30))
        return self.clients[-1]

    def replicas(self) -> dict[str, dict[str, Any]]:
        return dict(ray.get(self.controller.replicas.remote()))

    def plan(self) -> dict[str, Any]:
        return dict(ray.get(self.controller.plan.remote()))

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in (self.state_dir / "events.jsonl").read_text().splitlines()]


def _args(state_dir: Path) -> AppArgs:
    local = yaml.safe_load((ROOT / "configs/local.yaml").read_text())["applications"][0]["args"]
    local.update(topology=PAIRS, time_scale=0.2, state_dir=str(state_dir), counters_interval_s=0,
                 drain_timeout_s=20,
                 pools=[{"name": "mixed", "role": "mixed", "tp": 2, "replicas": 3, "model": "llama-3.1-8b",
                         "slo_classes": ["interactive", "standard", "batch"]}])
    local["router"]["port"] = 0
    return parse_app_args(local)


def _stale(name: str, labels: dict[str, str]) -> dict[str, str]:
    """Node b is started with stale arguments (its islands label missing): the check says so."""
    return {k: v for k, v in labels.items() if not (name == "b" and k == "isle.io/islands")}


@pytest.fixture(scope="module")
def product(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Product]:
    state_dir = tmp_path_factory.mktemp("controller")
    args = _args(state_dir)
    engines: list[int] = []
    with fake_cluster(read_source(PAIRS), ("a", "b"), num_gpus=4, labels=_stale) as address:
        controller, router = get_or_create_controller(controller_spec(args)), None
        p: Product | None = None
        try:
            router = RouterThread(args, controller)
            ray_ids = {n.labels[NODE_LABEL]: n.node_id for n in ray_nodes() if NODE_LABEL in n.labels}
            p = Product(controller=controller, router=router, ray_ids=ray_ids, state_dir=state_dir, address=address)
            engines = [r["pid"] for r in p.replicas().values()]
            yield p
            engines += [r["pid"] for r in p.replicas().values()]
        finally:
            for c in p.clients if p is not None else []:
                c.close()
            time.sleep(0.2)  # the router sees the clients leave
            if router is not None:
                router.stop()
            ray.get(controller.shutdown.remote(), timeout=60)
    assert not [pid for pid in engines if _alive(pid)], "engine processes left behind"


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _metric(url: str, name: str) -> float | None:
    """A counter of an engine's /metrics; None once the engine is gone."""
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=2) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_every_replica_runs_on_its_planned_node_holding_its_planned_gpus(product: Product) -> None:
    plan, infos = product.plan(), product.replicas()
    assert sorted(infos) == sorted(p["replica_id"] for p in plan["placements"]) and len(infos) == 3
    assert {p["node"] for p in plan["placements"]} == {"a", "b"}
    for p in plan["placements"]:
        info, gpus = infos[p["replica_id"]], p["gpus"]
        assert info["ray_node_id"] == product.ray_ids[p["node"]]
        assert info["ray_node_labels"]["isle.io/node"] == p["node"]
        assert info["ray_resources"] == {f"isle_gpu_{p['node']}_{g}": 1.0 for g in gpus}
        assert info["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, gpus))
        assert info["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        nic = "mlx5_0" if gpus == [0, 1] else "mlx5_1"
        assert info["env"]["NCCL_IB_HCA"] == nic and info["env"]["UCX_NET_DEVICES"] == f"{nic}:1"
        numa = {0, 1} if gpus == [0, 1] else {2, 3}
        if numa <= os.sched_getaffinity(0):
            assert info["cpu_affinity"] == ("0-1" if gpus == [0, 1] else "2-3")
        else:
            assert any("not applied: this host lacks CPUs" in n for n in info["notes"]), info["notes"]
    check = plan["controller"]["node_check"]
    assert check["ok"] == ["a"] and "label isle.io/islands=2_2 missing" in check["problems"]["b"][0]
    req = urllib.request.Request(f"{product.base}/admin/plan", headers={"authorization": f"Bearer {DEV_ADMIN_KEY}"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert json.loads(resp.read())["controller"]["node_check"]["problems"].keys() == {"b"}
    assert any(e["kind"] == "topology" and e["node_check"]["problems"] for e in product.events())


def _ask(client: openai.OpenAI, i: int) -> str:
    """One request; 'ok', or 'stream-error' when a stream that had started broke off cleanly."""
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": f"request {i}"}]
    if i % 3:
        out = client.chat.completions.create(model="llama-3.1-8b", messages=messages, max_tokens=24)
        assert out.usage is not None and out.usage.completion_tokens == 24
        return "ok"
    got = 0
    try:
        for chunk in client.chat.completions.create(model="llama-3.1-8b", messages=messages, max_tokens=24,
                                                    stream=True):
            got += sum(1 for c in chunk.choices if c.delta.content)
    except openai.APIError:
        if got:
            return "stream-error"
        raise
    assert got == 24
    return "ok"


def test_a_killed_engine_is_restarted_and_no_request_is_lost(product: Product) -> None:
    client = product.client()
    victim_id, victim = next(iter(sorted(product.replicas().items())))
    results: list[str] = []
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(_ask, client, i) for i in range(40)]
        wait_until(lambda: sum(f.done() for f in futures) >= 8, 60, "8 requests answered", interval_s=0.02)
        os.kill(victim["pid"], signal.SIGKILL)
        results = [f.result() for f in futures]  # raises if any request was lost
    assert results.count("ok") + results.count("stream-error") == 40 and results.count("ok") >= 36

    def restarted() -> dict[str, Any] | None:
        info: dict[str, Any] = product.replicas()[victim_id]
        return info if info["restarts"] == 1 and info["pid"] not in (None, victim["pid"]) else None

    info = wait_until(restarted, START_S, f"{victim_id} restarted", interval_s=0.5)
    assert info["ray_node_id"] == victim["ray_node_id"] and info["env"] == victim["env"]
    # the engine's actor restarts its process itself; the controller records it on its next pass
    wait_until(lambda: any(e["kind"] == "restart" and e["replica_id"] == victim_id for e in product.events()),
               START_S, f"{victim_id}'s restart recorded", interval_s=0.5)
    assert all(_ask(client, 100 + i) == "ok" for i in range(1, 7))


def test_a_marked_link_drains_and_replaces_the_replica(product: Product) -> None:
    plan = product.plan()
    victim = next(p for p in plan["placements"] if p["node"] == "a" and p["gpus"] == [0, 1])
    old = product.replicas()[victim["replica_id"]]
    client = product.client()
    stop, failures = threading.Event(), []

    def interactive() -> None:
        while not stop.is_set():
            try:
                client.chat.completions.create(model="llama-3.1-8b", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=4, extra_headers={"x-slo-class": "interactive"})
            except openai.APIError as err:
                failures.append(err)

    workers = [threading.Thread(target=interactive) for _ in range(3)]
    for w in workers:
        w.start()
    try:
        before = _metric(old["url"], "vllm:prompt_tokens_total")
        wait_until(lambda: _metric(old["url"], "vllm:prompt_tokens_total") != before, 15,
                   "traffic on the replica (it must have some to lose)", interval_s=0.2)
        marked_at = time.monotonic()
        moves = ray.get(product.controller.mark_link.remote("a", 0, 1, reason="test: NVLink down"))
        assert [(m["replica_id"], m["order"]) for m in moves] == [(victim["replica_id"], "make-before-break")]
        last, last_change = _metric(old["url"], "vllm:prompt_tokens_total"), time.monotonic()
        while time.monotonic() - marked_at < DRAIN_BOUND_S + 3:
            now = _metric(old["url"], "vllm:prompt_tokens_total")
            if now is None:
                break  # stopped, idle
            if now != last:
                last, last_change = now, time.monotonic()
            time.sleep(0.2)
        assert last_change - marked_at <= DRAIN_BOUND_S
    finally:
        stop.set()
        for w in workers:
            w.join(30)
    assert not failures, failures[:3]

    def replaced() -> dict[str, Any] | None:  # the loop above also ends on a /metrics timeout on a loaded machine
        now = product.replicas()[victim["replica_id"]]
        return now if now["pid"] != old["pid"] else None

    new = wait_until(replaced, START_S, "the replacement replica", interval_s=0.5)
    placed = next(p for p in product.plan()["placements"] if p["replica_id"] == victim["replica_id"])
    assert (placed["node"], placed["gpus"]) == ("b", [2, 3]) and new["ray_node_id"] == product.ray_ids["b"]
    assert new["env"]["CUDA_VISIBLE_DEVICES"] == "2,3" and new["ray_resources"] == {"isle_gpu_b_2": 1.0,
                                                                                   "isle_gpu_b_3": 1.0}
    def steps() -> list[tuple[str, object]]:
        return [(e["kind"], e.get("generation")) for e in product.events()
                if e["kind"] == "drain" or e.get("replica_id") == victim["replica_id"]]

    assert steps().index(("drain", None)) < steps().index(("replica_started", 1))  # drained, then replaced ...
    wait_until(lambda: ("stopped", 0) in steps(), START_S, "the old replica stopped", interval_s=0.5)  # ... when idle
    assert steps().index(("replica_started", 1)) < steps().index(("stopped", 0)) and not _alive(old["pid"])
    fingerprints = {e["fingerprint"] for e in product.events() if e["kind"] in ("topology", "plan")}
    assert len(fingerprints) == 2  # before and after the mark

    def mark(*args: str) -> subprocess.CompletedProcess[str]:  # as an operator does it
        return subprocess.run([sys.executable, "-m", "pools", "mark-link", *args, "--address", product.address],
                              capture_output=True, text=True, timeout=START_S, check=False)

    back = mark("a", "0", "1", "--healthy", "--reason", "test: repaired")
    assert back.returncode == 0 and json.loads(back.stdout) == {"moves": []}, back.stderr  # nothing moves back
    assert product.plan()["controller"]["marked_links"] == []
    wrong = mark("a", "0", "7")
    assert wrong.returncode == 2 and "node a has no link GPU0-GPU7" in wrong.stderr


def test_replace_moves_a_replica_off_its_gpus_on_command(product: Product) -> None:
    """`python -m pools replace` (a PD pair on the wrong path, say): make-before-break onto free GPUs."""
    taken = {(p["node"], tuple(p["gpus"])) for p in product.plan()["placements"]}
    victim = sorted(product.replicas())[0]
    old = product.replicas()[victim]

    def replace(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pools", "replace", *args, "--address", product.address],
                              capture_output=True, text=True, timeout=START_S, check=False)

    done = replace(victim, "--reason", "test: KV path wrong_path")
    assert done.returncode == 0, done.stderr
    (move,) = json.loads(done.stdout)["moves"]
    assert (move["replica_id"], move["order"]) == (victim, "make-before-break")
    new = wait_until(lambda: (r := product.replicas()[victim])["pid"] != old["pid"] and r, START_S, "the replacement",
                     interval_s=0.5)
    placed = next(p for p in product.plan()["placements"] if p["replica_id"] == victim)
    assert (placed["node"], tuple(placed["gpus"])) not in taken and new["env"]["CUDA_VISIBLE_DEVICES"] != ""
    wait_until(lambda: not _alive(old["pid"]), START_S, "the old replica stopped once idle", interval_s=0.5)
    wrong = replace("mixed-9")
    assert wrong.returncode == 2 and "replica 'mixed-9' is not serving steadily" in wrong.stderr


def test_a_restarted_controller_reattaches_to_its_replicas(product: Product) -> None:
    before = {rid: (r["actor_pid"], r["pid"], r["url"]) for rid, r in product.replicas().items()}
    names = sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True))
    version = ray.get(product.controller.table.remote()).version
    ray.kill(product.controller, no_restart=False)  # the actor process dies; Ray starts it again
    wait_until(lambda: ray.get(product.controller.table.remote(), timeout=10).version > version, START_S,
               "the controller back with a newer table", interval_s=0.5,
               ignore=(ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError))
    assert {rid: (r["actor_pid"], r["pid"], r["url"]) for rid, r in product.replicas().items()} == before
    assert sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)) == names  # no duplicates
    assert any(e["kind"] == "resumed" and sorted(e["reattached"]) == sorted(before) for e in product.events())
    assert product.client().chat.completions.create(
        model="llama-3.1-8b", messages=[{"role": "user", "content": "still there?"}], max_tokens=2).choices
