"""`python -m router bench`: our router, nginx (plain reverse proxy) and the Rust vllm-router, side
by side on loopback in front of the same two fast fake backends, medians of `--reps` runs.

Ours runs with `workers: 2` by default (`--workers`), as nginx runs two worker processes and the
Rust router a thread per core. Per proxy: requests/s and proxy CPU-seconds per 1,000 requests at
saturation (wrk, 64 connections), added latency p50/p99 at a fixed 200 req/s (open loop,
interleaved with the same rate against the backend directly, so both see the same moments of a
shared machine), and the same for streaming (64-chunk streams: saturation, and time to first
chunk p99 of 32 simultaneous streams in rounds alternating with the backend directly), and the
added per-chunk delivery p99 of 64 synchronised streams (the backend stamps each chunk with its
send time and emits every stream's chunks on one 10 ms
grid). Installs missing peers itself: nginx from Debian's packages, the Rust router into
`.bench/vllm-router` (a side environment).
"""

from __future__ import annotations

import asyncio
import functools
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from router.bench import load
from router.config import DEV_ADMIN_KEY, DEV_KEY, sha256
from wire import native
from wire.processes import ChildExited, ChildNotReady, Output, ReadyLine, ReadyProbe
from wire.supervisor import Child

SIDE = Path(".bench")


def _takes_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 0.5).close()
    except OSError:
        return False
    return True


def _spawn(cmd: list[str], ready: str | None = None, port: int | None = None,
           env: dict[str, str] | None = None) -> Child:
    """Started and ready: its `ready` line, or `port` taking connections (stopped: SIGTERM, SIGKILL after 10 s)."""
    check = ReadyLine(ready) if ready is not None else ReadyProbe(functools.partial(_takes_connections, port or 0))
    proc = Child(cmd, name=cmd[0], ready=check, stderr=Output.DEVNULL, env=env).start()
    try:
        proc.wait_ready(60, poll_s=0.2)
    except ChildExited as err:
        raise RuntimeError(f"{cmd[0]} exited with {err.exit_code}") from None
    except ChildNotReady:
        raise RuntimeError(f"{cmd[0]} did not start") from None
    return proc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ensure_peers() -> tuple[str, str]:
    if shutil.which("nginx") is None or shutil.which("wrk") is None:
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", "nginx-light", "wrk"], check=True)
    venv = SIDE / "vllm-router"
    binary = venv / "bin" / "vllm-router"
    if not binary.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "vllm-router==0.1.17"], check=True)
    return str(shutil.which("nginx")), str(binary)


def _ours(backends: list[str], port: int, workdir: Path, workers: int) -> Child:
    config = {"port": port, "workers": workers, "keys": [{"tenant": "bench", "key_sha256": sha256(DEV_KEY)}],
              "admin_keys": [{"tenant": "ops", "key_sha256": sha256(DEV_ADMIN_KEY)}],
              "pd": {"enabled": False}, "default_profile": {"scorers": {"queue-depth-scorer": 1.0}},
              "replicas": [{"replica_id": f"b{i}", "url": b, "model": "fake"} for i, b in enumerate(backends)]}
    path = workdir / "router.yaml"
    path.write_text(yaml.safe_dump(config))
    return _spawn([sys.executable, "-m", "router", "--config", str(path)], ready="ready:")


def _nginx(binary: str, backends: list[str], port: int, workdir: Path) -> Child:
    servers = "\n".join(f"    server {b.removeprefix('http://')};" for b in backends)
    conf = f"""worker_processes 2;
pid {workdir}/nginx.pid;
error_log {workdir}/nginx-error.log;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {workdir}/body;
  proxy_temp_path {workdir}/proxy;
  upstream backends {{
{servers}
    keepalive 256;
  }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://backends;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
"""
    (workdir / "nginx.conf").write_text(conf)
    return _spawn([binary, "-c", str(workdir / "nginx.conf"), "-p", str(workdir), "-g", "daemon off;"], port=port)


def _vllm_router(binary: str, backends: list[str], port: int) -> Child:
    return _spawn([binary, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *backends,
                   "--policy", "round_robin", "--prometheus-port", str(_free_port())], port=port)


def _measure(proc: Child, port: int, direct: int, seconds: float) -> dict[str, float]:
    cpu0 = load.tree_cpu_s(proc.pid)
    rps = load.wrk(port, load.CHAT, seconds)
    cpu = load.tree_cpu_s(proc.pid) - cpu0
    mine, base = asyncio.run(load.open_loop(port, 200, seconds, peer=direct))
    cpu0 = load.tree_cpu_s(proc.pid)
    srps = load.wrk(port, load.STREAM, seconds)
    scpu = load.tree_cpu_s(proc.pid) - cpu0
    ttfc, ttfc_base = asyncio.run(load.streams(port, 32, 5, peer=direct))
    chunk, chunk_base = asyncio.run(load.chunk_delivery(port, 64, 64, 10.0, peer=direct, rounds=2))
    return {"rps": rps, "cpu_s_per_1k": cpu / (rps * seconds / 1000),
            "p50_added_ms": (load.pct(mine, 0.5) - load.pct(base, 0.5)) * 1000,
            "p99_added_ms": (load.pct(mine, 0.99) - load.pct(base, 0.99)) * 1000,
            "s_rps": srps, "s_cpu_s_per_1k": scpu / (srps * seconds / 1000),
            "ttfc_p99_added_ms": (load.pct(ttfc, 0.99) - load.pct(ttfc_base, 0.99)) * 1000,
            "chunk_p99_added_ms": (load.pct(chunk, 0.99) - load.pct(chunk_base, 0.99)) * 1000}


def _candidate(server: str, backends: list[str], port: int, workers: int, env: dict[str, str]) -> Child:
    from router.bench.candidates import command

    return _spawn(command(server, "proxy", port, workers), port=port,
                  env={**env, "ISLE_BENCH_BACKENDS": ",".join(backends)})


def front_door(workers: int = 2) -> dict[str, dict[str, str]]:
    """The issue-15 probes against ours and the candidates, each serving the same echo app."""
    from router.bench.candidates import command, ensure_servers
    from router.bench.probes import run_probes

    env = ensure_servers()
    starters: dict[str, Callable[[int], Child]] = {
        "ours": lambda p: _spawn([sys.executable, "-m", "router.bench.probes", "--serve", str(p)], ready="ready:"),
        "uvicorn": lambda p: _spawn(command("uvicorn", "echo", p, workers), port=p, env=env),
        "granian": lambda p: _spawn(command("granian", "echo", p, workers), port=p, env=env),
    }
    results = {}
    for name, start in starters.items():
        port = _free_port()
        proc = start(port)
        try:
            time.sleep(0.5)
            results[name] = run_probes(port, proc.pid)
        finally:
            proc.stop()
    return results


def run(reps: int = 3, seconds: float = 5.0, workers: int = 2, servers: bool = False) -> dict[str, Any]:
    nginx, vllm_router = _ensure_peers()
    workdir = Path(tempfile.mkdtemp(prefix="isle-bench-"))
    ports = [_free_port(), _free_port()]
    backends_p = [_spawn([sys.executable, "-m", "router.bench.fake_backend", "--port", str(p)], ready="ready:")
                  for p in ports]
    backends = [f"http://127.0.0.1:{p}" for p in ports]
    direct = ports[0]
    starters: dict[str, Callable[[int], Child]] = {
        "ours": lambda p: _ours(backends, p, workdir, workers),
        "nginx": lambda p: _nginx(nginx, backends, p, workdir),
        "vllm_router": lambda p: _vllm_router(vllm_router, backends, p),
    }
    if servers:  # the maintained data planes the router could sit on, as their floor (router.bench.candidates)
        from router.bench.candidates import ensure_servers

        env = ensure_servers()
        starters["uvicorn_floor"] = lambda p: _candidate("uvicorn", backends, p, workers, env)
        starters["granian_floor"] = lambda p: _candidate("granian", backends, p, workers, env)
    results: dict[str, list[dict[str, float]]] = {name: [] for name in starters}
    try:
        for name, start in starters.items():
            port = _free_port()
            proc = start(port)
            try:
                load.wrk(port, load.CHAT, 1.0)  # warm-up
                for _ in range(reps):
                    results[name].append(_measure(proc, port, direct, seconds))
            finally:
                proc.stop()
    finally:
        for b in backends_p:
            b.stop()
    figures = {name: _summary(runs) for name, runs in results.items()}
    figures["ours"]["request_path"] = native.state()  # the router processes import what this one does
    return figures


def _summary(runs: list[dict[str, float]]) -> dict[str, Any]:
    def med(key: str) -> float:
        return round(load.median([r[key] for r in runs]), 4)

    return {"rps": med("rps"), "cpu_s_per_1k": med("cpu_s_per_1k"), "p50_added_ms": med("p50_added_ms"),
            "p99_added_ms": med("p99_added_ms"),
            "streaming": {"rps": med("s_rps"), "cpu_s_per_1k": med("s_cpu_s_per_1k"),
                          "ttfc_p99_added_ms": med("ttfc_p99_added_ms"),
                          "chunk_p99_added_ms": med("chunk_p99_added_ms")}}


def main(fmt: str, reps: int, seconds: float, workers: int = 2, servers: bool = False,
         probes: bool = False) -> int:
    if probes:
        table = front_door(workers)
        if fmt == "json":
            print(json.dumps(table))
            return 0
        names = list(table)
        print(f"{'probe':<42}" + "".join(f"{n:<34}" for n in names))
        for probe in table[names[0]]:
            print(f"{probe:<42}" + "".join(f"{table[n][probe]:<34}" for n in names))
        return 0
    figures = run(reps, seconds, workers, servers)
    if fmt == "json":
        print(json.dumps(figures))
        return 0
    print(f"ours: request path {figures['ours']['request_path']} (wire/native.py)")
    print(f"{'proxy':<12} {'req/s':>9} {'CPU ms/1k':>10} {'+p50 ms':>8} {'+p99 ms':>8} {'stream/s':>9} "
          f"{'CPU ms/1k':>10} {'+TTFC p99':>10} {'+chunk p99':>11}")
    for name, f in figures.items():
        s = f["streaming"]
        print(f"{name:<12} {f['rps']:>9.0f} {f['cpu_s_per_1k'] * 1000:>10.1f} {f['p50_added_ms']:>8.3f} "
              f"{f['p99_added_ms']:>8.3f} {s['rps']:>9.0f} {s['cpu_s_per_1k'] * 1000:>10.1f} "
              f"{s['ttfc_p99_added_ms']:>10.3f} {s['chunk_p99_added_ms']:>11.3f}")
    return 0
