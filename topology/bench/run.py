"""Run a node's probes: one worker process per GPU (rank = the GPU's position in index order),
a torch.distributed process group on loopback, NCCL on GPUs and gloo elsewhere (ranks then
stand in for GPUs: the same code path, the host's numbers). torch is imported lazily, only
to choose the backend; it is the optional `bench` extra (`torch==2.13.0`).
"""

from __future__ import annotations

import datetime
import importlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from topology.bench.plan import Probe
from topology.bench.record import BenchRecord, Measurement
from topology.errors import TopologyError
from topology.model import Topology

MIB = 1 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchSettings:
    backend: str = "auto"
    """auto: nccl when torch sees a GPU per rank, else gloo."""
    size_bytes: int | None = None
    """None: 256 MiB on NCCL, 8 MiB on gloo."""
    iters: int | None = None
    """None: 20 on NCCL, 5 on gloo."""
    timeout_s: float = 300.0


def choose_backend(requested: str, ranks: int) -> str:
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        raise TopologyError("the benchmark needs torch: pip install 'isleserve[bench]' (torch==2.13.0)") from None
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if requested == "auto":
        return "nccl" if gpus >= ranks else "gloo"
    if requested == "nccl" and gpus < ranks:
        raise TopologyError(f"--backend nccl needs {ranks} GPUs, torch sees {gpus}")
    return requested


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(world: int, backend: str, plan_path: Path, out: Path, timeout_s: float) -> list[subprocess.Popen[str]]:
    port = _free_port()
    env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    return [subprocess.Popen([sys.executable, "-m", "topology.bench.worker", "--rank", str(r), "--world", str(world),
                              "--port", str(port), "--backend", backend, "--plan", str(plan_path), "--out", str(out),
                              "--timeout", str(timeout_s)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
            for r in range(world)]


def _wait(procs: list[subprocess.Popen[str]], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    failed: list[str] = []
    for rank, proc in enumerate(procs):
        try:
            _, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise TopologyError(f"benchmark ranks still running after {timeout_s:g} s: stopped") from None
        if proc.returncode != 0:
            tail = " | ".join(err.strip().splitlines()[-3:])
            failed.append(f"rank {rank} exited {proc.returncode}: {tail}")
    if failed:
        raise TopologyError("benchmark failed: " + "; ".join(failed))


def run(topology: Topology, node_name: str, probes: Sequence[Probe], source: str,
        settings: BenchSettings = BenchSettings()) -> BenchRecord:
    node = topology.node(node_name)
    indices = sorted(g.index for g in node.gpus)
    rank_of = {g: r for r, g in enumerate(indices)}
    backend = choose_backend(settings.backend, len(indices))
    size = settings.size_bytes or (256 * MIB if backend == "nccl" else 8 * MIB)
    iters = settings.iters or (20 if backend == "nccl" else 5)
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    with tempfile.TemporaryDirectory(prefix="isle-bench-") as tmp:
        plan_path = Path(tmp, "plan.json")
        plan_path.write_text(json.dumps({"size_bytes": size, "iters": iters, "probes": [
            {"kind": p.kind, "ranks": [rank_of[g] for g in p.gpus]} for p in probes]}))
        _wait(_start(len(indices), backend, plan_path, Path(tmp), settings.timeout_s), settings.timeout_s)
        found = {r["probe"]: r for path in Path(tmp).glob("rank*.json") for r in json.loads(path.read_text())}
    measurements = tuple(Measurement(probe=p, size_bytes=size, iters=iters, bandwidth_gb_s=found[i]["bandwidth_gb_s"],
                                     latency_us=found[i]["latency_us"]) for i, p in enumerate(probes) if i in found)
    return BenchRecord(fingerprint=topology.fingerprint(), source=source, node=node_name, backend=backend,
                       device="cuda" if backend == "nccl" else "cpu", started_at=started, measurements=measurements)
