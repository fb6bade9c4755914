"""Run a node's probes: one worker process per GPU (rank = the GPU's position in index order),
a torch.distributed process group on loopback, NCCL on GPUs and gloo elsewhere (ranks then
stand in for GPUs: the same code path, the host's numbers). Between two nodes each node runs
one rank (`run_rank`, called on each node, e.g. by a Ray task there) against the first node's
address, and `record_between` makes the record. torch is imported lazily, only to choose the
backend; it is the optional `bench` extra (`torch==2.13.0`).
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
from topology.bench.record import BenchRecord, Measurement, node_fingerprint, pair_fingerprint
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(world: int, backend: str, plan_path: Path, out: Path, timeout_s: float, *, ranks: Sequence[int] = (),
           master: str = "127.0.0.1", port: int = 0, devices: Sequence[int] = ()) -> list[subprocess.Popen[str]]:
    """Worker processes for `ranks` (default: all of them) of a group whose rank 0 listens at
    master:port; rank r uses device `devices[i]` (default: r)."""
    port = port or free_port()
    env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "OMP_NUM_THREADS": "1"}
    if master.startswith("127."):
        env["GLOO_SOCKET_IFNAME"] = "lo"
    chosen = list(ranks) or list(range(world))
    return [subprocess.Popen([sys.executable, "-m", "topology.bench.worker", "--rank", str(r), "--world", str(world),
                              "--master", master, "--port", str(port), "--backend", backend, "--plan", str(plan_path),
                              "--out", str(out), "--timeout", str(timeout_s),
                              "--device", str(devices[i] if devices else r)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
            for i, r in enumerate(chosen)]


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


def sizes(backend: str, settings: BenchSettings) -> tuple[int, int]:
    """(message bytes, timed iterations) for a backend."""
    return (settings.size_bytes or (256 * MIB if backend == "nccl" else 8 * MIB),
            settings.iters or (20 if backend == "nccl" else 5))


def started_now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _plan_file(directory: str, probes: Sequence[Probe], ranks: Sequence[Sequence[int]], size: int,
               iters: int) -> Path:
    path = Path(directory, "plan.json")
    path.write_text(json.dumps({"size_bytes": size, "iters": iters, "probes": [
        {"kind": p.kind, "ranks": list(r)} for p, r in zip(probes, ranks, strict=True)]}))
    return path


def _results(directory: str) -> dict[int, dict[str, float]]:
    return {r["probe"]: r for path in Path(directory).glob("rank*.json") for r in json.loads(path.read_text())}


def _measurements(probes: Sequence[Probe], found: dict[int, dict[str, float]], size: int,
                  iters: int) -> tuple[Measurement, ...]:
    return tuple(Measurement(probe=p, size_bytes=size, iters=iters, bandwidth_gb_s=found[i]["bandwidth_gb_s"],
                             latency_us=found[i]["latency_us"]) for i, p in enumerate(probes) if i in found)


def run(topology: Topology, node_name: str, probes: Sequence[Probe], source: str,
        settings: BenchSettings = BenchSettings()) -> BenchRecord:
    node = topology.node(node_name)
    indices = sorted(g.index for g in node.gpus)
    rank_of = {g: r for r, g in enumerate(indices)}
    backend = choose_backend(settings.backend, len(indices))
    size, iters = sizes(backend, settings)
    started = started_now()
    with tempfile.TemporaryDirectory(prefix="isle-bench-") as tmp:
        plan_path = _plan_file(tmp, probes, [[rank_of[g] for g in p.gpus] for p in probes], size, iters)
        _wait(_start(len(indices), backend, plan_path, Path(tmp), settings.timeout_s, devices=indices),
              settings.timeout_s)
        found = _results(tmp)
    return BenchRecord(fingerprint=node_fingerprint(topology, node_name), source=source, node=node_name,
                       backend=backend, device="cuda" if backend == "nccl" else "cpu", started_at=started,
                       measurements=_measurements(probes, found, size, iters))


def run_rank(probes: Sequence[Probe], rank: int, master: str, port: int, backend: str,
             settings: BenchSettings = BenchSettings()) -> dict[int, dict[str, float]]:
    """This host's rank of a two-node benchmark (rank 0 on `probes`' first node, listening at
    master:port; rank 1 on the peer). Rank 0 returns what it measured, probe index -> figures."""
    size, iters = sizes(backend, settings)
    device = probes[0].gpus[rank] if probes else rank
    with tempfile.TemporaryDirectory(prefix="isle-bench-") as tmp:
        plan_path = _plan_file(tmp, probes, [[0, 1] for _ in probes], size, iters)
        _wait(_start(2, backend, plan_path, Path(tmp), settings.timeout_s, ranks=[rank], master=master, port=port,
                     devices=[device]), settings.timeout_s)
        return _results(tmp)


def record_between(topology: Topology, probes: Sequence[Probe], found: dict[int, dict[str, float]], backend: str,
                   source: str, started_at: str, settings: BenchSettings = BenchSettings()) -> BenchRecord:
    """The record of a two-node benchmark, from rank 0's results."""
    a, b = probes[0].node, str(probes[0].peer)
    size, iters = sizes(backend, settings)
    return BenchRecord(fingerprint=pair_fingerprint(topology, a, b), source=source, node=a, peer=b, backend=backend,
                       device="cuda" if backend == "nccl" else "cpu", started_at=started_at,
                       measurements=_measurements(probes, found, size, iters))
