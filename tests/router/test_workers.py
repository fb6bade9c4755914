"""`workers: 2`: two router processes on one port (SO_REUSEPORT) in front of a simulated engine,
as a user starts them with `python -m router --config`: both serve, /metrics is one view
whichever answers, a killed worker is replaced, the view reaches every worker, and nothing is
left behind when the router stops."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from router.config import DEV_ADMIN_KEY, DEV_KEY, sha256
from tests.support.engines import EngineProcess, running_router, start_engine, stop_engine
from tests.support.wait import wait_until, wait_until_async

pytestmark = pytest.mark.integration
MODEL = "llama-3.1-8b"


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        out.extend(int(p) for p in text)
    return out


def get(url: str, key: str | None = None) -> bytes:
    req = urllib.request.Request(url, headers={"authorization": f"Bearer {key}", "connection": "close"} if key else
                                 {"connection": "close"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        body: bytes = resp.read()
        return body


def requests_total(text: str, outcome: str = "ok") -> float:
    pattern = r'^isle_router_requests_total\{outcome="' + outcome + r'",slo_class="standard"\} (\S+)$'
    found = re.findall(pattern, text, re.M)
    return sum(float(v) for v in found)


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    engine: EngineProcess = start_engine("--model", MODEL, "--gpu", "h100-sxm", "--time-scale", "0.01")
    try:
        config = {"port": 0, "workers": 2, "keys": [{"tenant": "dev", "key_sha256": sha256(DEV_KEY)}],
                  "admin_keys": [{"tenant": "ops", "key_sha256": sha256(DEV_ADMIN_KEY)}],
                  "slo_classes": [{"name": "standard", "priority": 1, "ttft_ms": 2000, "tpot_ms": 100,
                                   "max_concurrency": 3}],
                  "pd": {"enabled": False}, "scrape_interval_s": 0.2,
                  "replicas": [{"replica_id": "e1", "url": engine.base, "model": MODEL}]}
        with running_router(config, tmp_path_factory.mktemp("router")) as (proc, url):
            yield {"url": url, "base": url.removesuffix("/v1"), "proc": proc}
    finally:
        stop_engine(engine)


def test_both_workers_serve_the_port(router: dict[str, Any]) -> None:
    seen = set()
    for _ in range(40):  # a new connection each: the kernel spreads them over both listeners
        seen.add(json.loads(get(router["base"] + "/admin/replicas", DEV_ADMIN_KEY))["worker"])
        if seen == {0, 1}:
            break
    assert seen == {0, 1}
    assert len(children(router["proc"].pid)) == 1


def pool_requests(text: str) -> float:
    """What the autoscaler's load report counts: requests sent to the replicas' pools."""
    return sum(float(v) for v in re.findall(r'^isle_router_pool_requests_total\{pool="[^"]*"\} (\S+)$', text, re.M))


def test_metrics_are_one_view_whichever_worker_answers(router: dict[str, Any]) -> None:
    before = requests_total(get(router["base"] + "/metrics").decode())
    sent = pool_requests(get(router["base"] + "/metrics").decode())
    n = 12
    for i in range(n):  # fresh client, fresh connection: both workers serve some of them
        with openai.OpenAI(base_url=router["url"], api_key=DEV_KEY, max_retries=0, timeout=30) as c:
            out = c.completions.create(model=MODEL, prompt=f"hello {i}", max_tokens=3)
            assert out.usage is not None and out.usage.completion_tokens == 3
    views = {requests_total(get(router["base"] + "/metrics").decode()) for _ in range(10)}
    assert views == {before + n}
    assert {pool_requests(get(router["base"] + "/metrics").decode()) for _ in range(10)} == {sent + n}
    text = get(router["base"] + "/metrics").decode()
    assert re.search(r'^isle_router_replica_healthy\{replica="e1"\} 1\.0$', text, re.M)
    assert text.count("# TYPE isle_router_ttft_seconds histogram") == 1


def test_a_killed_worker_is_replaced(router: dict[str, Any]) -> None:
    (worker,) = children(router["proc"].pid)
    os.kill(worker, signal.SIGKILL)
    wait_until(lambda: (now := children(router["proc"].pid)) and now != [worker], 20, "a new worker",
               interval_s=0.2)
    seen: set[int] = set()

    def both_answer() -> bool:  # a new connection each; OSError: the replacement is still starting
        seen.add(json.loads(get(router["base"] + "/admin/replicas", DEV_ADMIN_KEY))["worker"])
        return seen == {0, 1}

    wait_until(both_answer, 20, "both workers answer", interval_s=0.01, ignore=(OSError,))


def worker_dir(pid: int) -> Path:
    """The private directory a worker was started with (`python -m router.worker DIR INDEX`)."""
    args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return Path(args[args.index(b"router.worker") + 1].decode())


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def wait_gone(pids: list[int], timeout_s: float = 10) -> None:
    wait_until(lambda: all(gone(p) for p in pids), timeout_s, f"processes {pids} gone", interval_s=0.1)


def test_stopping_the_leader_stops_every_worker(tmp_path: Path) -> None:
    config = {"port": 0, "workers": 3, "require_keys": False, "pd": {"enabled": False},
              "replicas": [{"replica_id": "x", "url": "http://127.0.0.1:9", "model": MODEL}]}
    with running_router(config, tmp_path) as (proc, _url):
        workers = children(proc.pid)
        assert len(workers) == 2
        dirs = {worker_dir(w) for w in workers}
        assert len(dirs) == 1 and all((d / "0.sock").exists() for d in dirs)
    wait_gone(workers)
    assert not any(d.exists() for d in dirs)


def test_a_worker_left_alone_stops_and_cleans_up(tmp_path: Path) -> None:
    config = {"port": 0, "workers": 2, "require_keys": False, "pd": {"enabled": False},
              "replicas": [{"replica_id": "x", "url": "http://127.0.0.1:9", "model": MODEL}]}
    with running_router(config, tmp_path) as (proc, _url):
        (worker,) = children(proc.pid)
        directory = worker_dir(worker)
        proc.kill()  # the leader dies without a word
        wait_gone([worker])
        assert not directory.exists()


async def _admin_from(port: int, worker: int, deadline_s: float = 20) -> dict[str, Any]:
    """/admin/replicas as the given worker answers it (new connections until that one answers)."""
    async def ask() -> dict[str, Any] | None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"GET /admin/replicas HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {DEV_ADMIN_KEY}\r\n"
                     "connection: close\r\n\r\n".encode())
        raw = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        answer: dict[str, Any] = json.loads(raw.split(b"\r\n\r\n", 1)[1])
        return answer if answer["worker"] == worker else None

    found: dict[str, Any] = await wait_until_async(ask, deadline_s, f"worker {worker} answers", interval_s=0)
    return found


def test_a_newer_table_reaches_every_worker() -> None:
    """What the Serve replica's router does when the controller publishes a new table."""
    asyncio.run(_newer_table())


async def _newer_table() -> None:
    from pools.routing import ReplicaEndpoint
    from router.cli import table_from_config
    from router.config import RouterConfig
    from router.server import Router

    config = RouterConfig.model_validate({
        "port": 0, "workers": 2, "keys": [{"tenant": "t", "key_sha256": sha256(DEV_KEY)}],
        "admin_keys": [{"tenant": "ops", "key_sha256": sha256(DEV_ADMIN_KEY)}], "pd": {"enabled": False},
        "replicas": [{"replica_id": "old", "url": "http://127.0.0.1:9", "model": MODEL}]})
    router = Router(config, table_from_config(config), plan={"policy": "first"})
    await router.start()
    try:
        first = await _admin_from(router.port, 1)
        assert first["version"] == 1 and [r["replica_id"] for r in first["replicas"]] == ["old"]
        table = router.replicas.table
        newer = type(table)(version=5, replicas=(ReplicaEndpoint(replica_id="new", url="http://127.0.0.1:10",
                                                                 model=MODEL, pool="p", role="mixed", node="n1"),))
        await router.set_view(newer, None, {"policy": "second"})
        seen = await _admin_from(router.port, 1)
        assert seen["version"] == 5 and [(r["replica_id"], r["node"]) for r in seen["replicas"]] == [("new", "n1")]
        assert router.workers is not None
        (pid,) = router.workers.pids()
        os.kill(pid, signal.SIGKILL)  # a worker restarted after the change starts from the newest view
        workers = router.workers
        await wait_until_async(lambda: workers.pids() not in ([], [pid]), 20, "a new worker", interval_s=0.1)
        again = await _admin_from(router.port, 1)
        assert again["version"] == 5
    finally:
        await router.stop()
