"""Issue 34 on loopback with real parts: the router in front of a simulated prefill and decode
engine (processes) measures each PD handover per pair and shows its verdict in /admin/replicas and
/metrics; a decode's NIXL counters, served vLLM-shaped by a real HTTP server on loopback, give
the decode's bandwidth. With the engine's transport-fallback fault (`kv_transport: tcp`), the
pair turns wrong_path, judged from the engine's per-prefill counters, and traffic leaves it."""

from __future__ import annotations

import json
import re
import urllib.error
from collections.abc import Iterator
from typing import Any

import pytest

from isleserve import status
from router.config import DEV_ADMIN_KEY, DEV_KEY, sha256
from tests.router.test_router import get
from tests.support.clients import openai_client
from tests.support.engines import EngineProcess, fault, running_router, start_engine, stop_engine, wait_until_idle
from tests.support.nixl import serving_nixl
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration
MODEL = "llama-3.1-8b"
LONG = "the prompt whose KV crosses the path " * 300


@pytest.fixture(scope="module")
def nixl_url() -> Iterator[str]:
    """A decode-shaped /metrics with NIXL counters that grow by 1 GB in 0.1 s per scrape (10 GB/s)."""
    scrapes = [0]

    def grow() -> dict[str, float]:
        n = scrapes[0] = scrapes[0] + 1
        return {"count": n, "seconds": 0.1 * n, "kv_bytes": 1e9 * n, "failed": 0}

    with serving_nixl(grow) as url:
        yield url


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, nixl_url: str) -> Iterator[dict[str, Any]]:
    common = ("--model", MODEL, "--gpu", "h100-sxm", "--topology", "configs/clusters/local-sim.yaml")
    specs = {"p1": ("prefill", "h100-0", [1]), "d1": ("decode", "h100-0", [2]), "d2": ("decode", "h100-0", [3])}
    engines: dict[str, EngineProcess] = {}
    try:
        for name, (role, node, gpus) in specs.items():
            placement = json.dumps({"node": node, "gpus": gpus})
            engines[name] = start_engine(*common, "--role", role, "--placement", placement, "--engine-id", name)
        replicas = [{"replica_id": name, "url": engines[name].base, "model": MODEL, "pool": f"pool-{role}",
                     "role": role, "node": node, "gpus": gpus, "gpu_model": "h100-sxm", "catalog_model": MODEL}
                    for name, (role, node, gpus) in specs.items()]
        replicas.append({"replica_id": "nx", "url": nixl_url, "model": "nixl-only", "role": "decode"})
        config = {
            "port": 0, "require_keys": True, "topology": "configs/clusters/local-sim.yaml",
            "keys": [{"tenant": "dev", "key_sha256": sha256(DEV_KEY)}],
            "admin_keys": [{"tenant": "ops", "key_sha256": sha256(DEV_ADMIN_KEY)}],
            "pd": {"enabled": True, "min_prompt_tokens": 500,
                   # the router's view carries HTTP and scheduling on a shared 2-core machine
                   "kv_path": {"noise_ms": 20.0, "window_s": 1.0, "avoid_after_s": 1.0, "cooldown_s": 60.0}},
            "scrape_interval_s": 0.2,
            "replicas": replicas,
        }
        with running_router(config, tmp_path_factory.mktemp("router")) as (_proc, url):
            yield {"url": url, "base": url.removesuffix("/v1"), "engines": engines}
    finally:
        for e in engines.values():
            stop_engine(e)


def admin(cluster: dict[str, Any]) -> dict[str, Any]:
    status, body = get(f"{cluster['base']}/admin/replicas", DEV_ADMIN_KEY)
    assert status == 200
    found: dict[str, Any] = json.loads(body)["kv_paths"]
    return found


def send(cluster: dict[str, Any], n: int, prompt: str = LONG) -> list[str]:
    client = openai_client(cluster["url"], DEV_KEY, timeout=30)
    served = []
    for _ in range(n):
        wait_until_idle(cluster["base"], DEV_ADMIN_KEY, ("p1", "d1", "d2"))
        raw = client.completions.with_raw_response.create(model=MODEL, prompt=prompt, max_tokens=2, stream=True)
        assert raw.headers["x-isle-prefill-replica"] == "p1"
        assert "".join(c.choices[0].text for c in raw.parse())
        served.append(raw.headers["x-isle-replica"])
    return served


def test_pairs_are_measured_and_judged_as_planned(cluster: dict[str, Any]) -> None:
    send(cluster, 4)
    view = admin(cluster)
    pairs = {row["pair"]: row for row in view["pairs"]}
    assert pairs and set(pairs) <= {"p1->d1", "p1->d2"}
    assert all(row["verdict"] == "as_planned" and row["tier"] == "nvlink" and row["samples"] >= 1
               for row in pairs.values()), pairs
    print(pairs)
    wait_until(lambda: admin(cluster)["decodes"].get("nx", {}).get("nixl_bandwidth_gb_s") == 10.0, 10,
               "the NIXL server's 10 GB/s in the router's view")
    _, text = get(f"{cluster['base']}/metrics")
    metrics = text.decode()
    some = next(iter(pairs))
    assert f'isle_kv_pair_verdict{{pair="{some}",verdict="as_planned"}} 1.0' in metrics
    assert f'isle_kv_transfer_seconds_count{{pair="{some}",tier="nvlink"}}' in metrics
    assert 'isle_kv_nixl_bandwidth_gbps{replica="nx"} 10.0' in metrics


def test_transport_fallback_is_flagged_and_traffic_leaves_the_pair(cluster: dict[str, Any]) -> None:
    """d1's KV moves at TCP speed (the engine's fault): its pair with p1 turns wrong_path, is
    avoided, and the requests go to d2."""
    d1 = cluster["engines"]["d1"]
    try:
        fault(d1, {"kv_transport": "tcp"})
    except urllib.error.HTTPError as err:  # the engine side of issue 34 not in this tree
        pytest.skip(f"the simulated engine has no kv_transport fault ({err.code})")
    try:
        long = LONG * 4  # ~8k tokens: 1 GB of KV, ~90 ms at TCP speed against ~3 ms over NVLink
        served = send(cluster, 2, long)
        wait_until(lambda: {r["pair"]: r for r in admin(cluster)["pairs"]}["p1->d1"]["verdict"] == "wrong_path", 10,
                   "p1->d1 judged wrong_path", seen=lambda: admin(cluster)["pairs"])
        after = send(cluster, 3, long)
        print(served, after, admin(cluster)["pairs"])
        assert after == ["d2"] * 3
        row = {r["pair"]: r for r in admin(cluster)["pairs"]}["p1->d1"]
        assert row["avoided"] and row["bandwidth_ratio"] < 0.5
        _, text = get(f"{cluster['base']}/metrics")
        assert 'isle_kv_pair_verdict{pair="p1->d1",verdict="wrong_path"} 1.0' in text.decode()
        shown = status.render(status.collect(cluster["base"], DEV_ADMIN_KEY))
        assert re.search(r"p1->d1 +nvlink +wrong_path, AVOIDED", shown), shown
    finally:
        fault(d1, {"clear": True})
