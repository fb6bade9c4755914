"""`python -m router bench --scrape`: what a Prometheus scrape of the router costs at
`configs/local.yaml`'s shape. A real router (`python -m router --config`) in front of four
simulated engines placed as the local plan places them (a prefill/decode pair on one H100
island, two mixed replicas on other nodes), the same SLO classes, pools and PD threshold;
`requests` requests of every class, short and long prompts, streamed and not; then `/metrics`
asked `scrapes` times: its size, and the time each answer took on loopback (the router's own
time to render it, plus two loopback hops). Figures, never asserts: the test of the same
deployment (`tests/ops/test_prometheus.py`) checks what a user would notice.

`local_deployment` and `drive` are shared with that test: the same engines, the same router."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

from router.bench.load import tree_cpu_s
from router.config import DEV_ADMIN_KEY, DEV_KEY, sha256
from wire.client import Client
from wire.processes import ChildError, ReadyLine
from wire.supervisor import Child

MODEL = "llama-3.1-8b"
TOPOLOGY = "configs/clusters/local-sim.yaml"
ROOT = Path(__file__).resolve().parents[2]
ENGINES: tuple[tuple[str, str, str, tuple[int, ...], str, str, str], ...] = (
    # replica, pool/role, node, gpus, island, tier, gpu: configs/local.yaml's plan (isleserve.planning)
    ("prefill-0", "prefill", "h100-0", (0, 1), "h100-0/island0", "nvlink", "h100-sxm"),
    ("decode-0", "decode", "h100-0", (2, 3), "h100-0/island0", "nvlink", "h100-sxm"),
    ("mixed-0", "mixed", "h100-degraded", (3,), "h100-degraded/island1", "local", "h100-sxm"),
    ("mixed-1", "mixed", "pcie-box", (0,), "pcie-box/island0", "local", "rtx-4090"),
)
POOL_CLASSES = {"prefill": ["interactive", "standard"], "decode": ["interactive", "standard"],
                "mixed": ["standard", "batch"]}
LONG = "a prompt long enough to go to the prefill/decode pair " * 40
SHORT = "Hello, how are you?"


@dataclass
class Deployment:
    base: str
    """The router's origin (no /v1)."""
    engines: dict[str, str] = field(default_factory=dict)
    """Replica id -> the engine's origin."""
    children: list[Child] = field(default_factory=list)


def _start(cmd: list[str], name: str, timeout_s: float) -> tuple[Child, str]:
    child = Child(cmd, name=name, ready=ReadyLine("ready:"), cwd=ROOT).start()
    try:
        line = child.wait_ready(timeout_s, poll_s=0.2)
    except ChildError as err:
        child.stop()
        raise RuntimeError(f"{name} did not start: {err}") from None
    return child, line.split("ready:")[1].strip().removesuffix("/v1")


def router_config(engines: dict[str, str], **extra: Any) -> dict[str, Any]:
    """The router of `configs/local.yaml` in front of these engines (replica id -> origin)."""
    return {
        "port": 0, "require_keys": True, "topology": TOPOLOGY,
        "keys": [{"tenant": "dev", "key_sha256": sha256(DEV_KEY)}],
        "admin_keys": [{"tenant": "dev-admin", "key_sha256": sha256(DEV_ADMIN_KEY)}],
        "slo_classes": [
            {"name": "interactive", "priority": 0, "ttft_ms": 500, "tpot_ms": 50},
            {"name": "standard", "priority": 1, "ttft_ms": 2000, "tpot_ms": 100},
            {"name": "batch", "priority": 2, "ttft_ms": 30000, "tpot_ms": 500, "sheddable": True,
             "max_concurrency": 64}],
        "default_slo_class": "standard", "pd": {"enabled": True, "min_prompt_tokens": 256},
        "scrape_interval_s": 0.5,
        "replicas": [{"replica_id": rid, "url": engines[rid], "model": MODEL, "pool": role, "role": role, "node": node,
                      "gpus": list(gpus), "island": island, "tier": tier, "tp": len(gpus), "gpu_model": gpu,
                      "catalog_model": MODEL, "slo_classes": POOL_CLASSES[role]}
                     for rid, role, node, gpus, island, tier, gpu in ENGINES],
        **extra}


@contextmanager
def local_deployment(directory: Path, time_scale: float = 1.0, **router: Any) -> Iterator[Deployment]:
    """Four simulated engines and a router, as `configs/local.yaml` places them, on loopback."""
    with ExitStack() as stack:
        engines: dict[str, str] = {}
        children: list[Child] = []
        for rid, role, node, gpus, _island, _tier, gpu in ENGINES:
            placement = orjson.dumps({"node": node, "gpus": list(gpus)}).decode()
            child, origin = _start([sys.executable, "-m", "pools", "sim-engine", "--port", "0", "--model", MODEL,
                                    "--gpu", gpu, "--tp", str(len(gpus)), "--time-scale", str(time_scale),
                                    "--topology", TOPOLOGY, "--role", role, "--placement", placement,
                                    "--engine-id", rid], rid, 60.0)
            stack.callback(child.stop)
            engines[rid], children = origin, [*children, child]
        path = directory / "router.yaml"
        path.write_text(yaml.safe_dump(router_config(engines, **router)))
        child, base = _start([sys.executable, "-m", "router", "--config", str(path)], "router", 60.0)
        stack.callback(child.stop)
        yield Deployment(base=base, engines=engines, children=[*children, child])


def _bodies(count: int) -> Iterator[tuple[str, bytes]]:
    """(class, body): every class, short prompts and long (PD), streamed and not, in turn."""
    shapes = (("interactive", SHORT, True), ("interactive", LONG, True), ("standard", SHORT, True),
              ("standard", LONG, False), ("standard", SHORT, False), ("batch", SHORT, False),
              ("batch", LONG, True), ("standard", LONG, True))
    for k in range(count):
        cls, prompt, stream = shapes[k % len(shapes)]
        yield cls, orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": f"{k} {prompt}"}],
                                 "max_tokens": 8, "stream": stream})


def drive(base: str, requests: int, concurrency: int = 8) -> dict[int, int]:
    """`requests` chat completions through the router; the count of each status."""
    def one(item: tuple[str, bytes], client: Client) -> int:
        cls, body = item
        return client.request("POST", "/v1/chat/completions", content=body,
                              headers={"content-type": "application/json", "x-slo-class": cls}).status

    statuses: dict[int, int] = {}
    clients = [Client(base, key=DEV_KEY, timeout_s=60.0) for _ in range(concurrency)]
    try:
        with ThreadPoolExecutor(concurrency) as pool:
            for status in pool.map(lambda kv: one(kv[1], clients[kv[0] % concurrency]), enumerate(_bodies(requests))):
                statuses[status] = statuses.get(status, 0) + 1
    finally:
        for c in clients:
            c.close()
    return statuses


def scrape_costs(base: str, scrapes: int, router_pid: int | None = None) -> dict[str, float]:
    """Size of the router's /metrics, the wall time of each scrape on loopback (ms), and, given
    the router's pid, the router's CPU per scrape (ms: its CPU time over the scrapes less what it
    spends as long without them, scraping its engines; /proc's clock ticks, so many scrapes)."""
    times: list[float] = []
    size = 0
    with Client(base, key=DEV_ADMIN_KEY, timeout_s=30.0) as client:
        cpu0, t0 = _cpu_s(router_pid), time.perf_counter()
        for _ in range(scrapes):
            t1 = time.perf_counter()
            reply = client.get("/metrics")
            times.append((time.perf_counter() - t1) * 1000)
            size = len(reply.body)
        busy_cpu_s, wall_s = _cpu_s(router_pid) - cpu0, time.perf_counter() - t0
    cpu1 = _cpu_s(router_pid)
    time.sleep(wall_s)
    idle_cpu_s = _cpu_s(router_pid) - cpu1
    times.sort()
    out = {"bytes": float(size), "scrape_ms_p50": statistics.median(times),
           "scrape_ms_p90": times[int(0.9 * (len(times) - 1))], "scrape_ms_max": times[-1]}
    if router_pid is not None:
        out["router_cpu_ms_per_scrape"] = max(0.0, busy_cpu_s - idle_cpu_s) * 1000 / scrapes
    return out


def _cpu_s(pid: int | None) -> float:
    return tree_cpu_s(pid) if pid is not None else 0.0


def run(directory: Path, requests: int = 1000, scrapes: int = 200) -> dict[str, Any]:
    with local_deployment(directory) as d:
        statuses = drive(d.base, requests)
        return {"requests": requests, "statuses": statuses, **scrape_costs(d.base, scrapes, d.children[-1].pid)}


def main(fmt: str, requests: int, scrapes: int, directory: Path) -> int:
    out = run(directory, requests, scrapes)
    if fmt == "json":
        print(orjson.dumps(out).decode())
    else:
        print(f"router /metrics after {out['requests']} requests (statuses {out['statuses']}): "
              f"{out['bytes'] / 1024:.1f} KiB; scrape on loopback p50 {out['scrape_ms_p50']:.2f} ms, "
              f"p90 {out['scrape_ms_p90']:.2f} ms, max {out['scrape_ms_max']:.2f} ms; the router's CPU "
              f"{out['router_cpu_ms_per_scrape']:.2f} ms a scrape")
    return 0


def families(text: str) -> Sequence[tuple[str, int, int]]:
    """(family, lines, bytes) of an exposition, biggest first: where the bytes go."""
    sizes: dict[str, list[int]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{")[0].split(" ")[0]
        for suffix in ("_bucket", "_count", "_sum", "_total", "_created"):
            name = name.removesuffix(suffix)
        row = sizes.setdefault(name, [0, 0])
        row[0] += 1
        row[1] += len(line) + 1
    return sorted(((n, r[0], r[1]) for n, r in sizes.items()), key=lambda x: -x[2])
