"""One rank of a communication benchmark (`python -m topology.bench.worker`, started by
topology.bench.run, one process per GPU): joins the process group on loopback, runs every probe
in the same order as every other rank (groups are created collectively) and writes what it
measured to `<out>/rank<r>.json`. torch is imported here only (an optional dependency).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SMALL_ITERS = 20


def _p2p(dist: Any, torch: Any, device: str, rank: int, pair: tuple[int, int], size_bytes: int, iters: int,
         sync: Callable[[], None]) -> tuple[float, float]:
    """Ping-pong between the pair: one-way latency of a 4-byte message and one-way bandwidth."""
    first, second = pair
    peer = second if rank == first else first

    def pingpong(t: Any, n: int) -> float:
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            if rank == first:
                dist.send(t, peer)
                dist.recv(t, peer)
            else:
                dist.recv(t, peer)
                dist.send(t, peer)
        sync()
        return (time.perf_counter() - t0) / (2 * n)

    small = torch.zeros(1, dtype=torch.float32, device=device)
    big = torch.zeros(max(1, size_bytes // 4), dtype=torch.float32, device=device)
    pingpong(small, 2)
    latency_s = pingpong(small, SMALL_ITERS)
    pingpong(big, 1)
    one_way_s = pingpong(big, iters)
    return big.numel() * 4 / one_way_s / 1e9, latency_s * 1e6


def _copy(torch: Any, device: str, direction: str, size_bytes: int, iters: int,
          sync: Callable[[], None]) -> tuple[float, float]:
    """Host<->device copy from/to pinned memory (on gloo: host to host, the path only)."""

    def buffers(n: int) -> tuple[Any, Any]:
        host = torch.zeros(n, dtype=torch.float32, pin_memory=device != "cpu")
        dev = torch.zeros(n, dtype=torch.float32, device=device)
        return (dev, host) if direction == "h2d" else (host, dev)

    def timed(pair: tuple[Any, Any], n: int) -> float:
        dst, src = pair
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            dst.copy_(src, non_blocking=True)
        sync()
        return (time.perf_counter() - t0) / n

    small, big = buffers(1), buffers(max(1, size_bytes // 4))
    timed(small, 2)
    latency_s = timed(small, SMALL_ITERS)
    timed(big, 1)
    return big[0].numel() * 4 / timed(big, iters) / 1e9, latency_s * 1e6


def _allreduce(dist: Any, torch: Any, device: str, group: Any, members: int, size_bytes: int, iters: int,
               sync: Callable[[], None]) -> tuple[float, float]:
    """Bus bandwidth (nccl-tests' busbw) of a large all-reduce; time of a 4-byte one."""

    def timed(t: Any, n: int) -> float:
        dist.barrier(group=group)
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            dist.all_reduce(t, group=group)
        sync()
        return (time.perf_counter() - t0) / n

    small = torch.zeros(1, dtype=torch.float32, device=device)
    big = torch.zeros(max(1, size_bytes // 4), dtype=torch.float32, device=device)
    timed(small, 2)
    latency_s = timed(small, SMALL_ITERS)
    timed(big, 1)
    seconds = timed(big, iters)
    return 2 * (members - 1) / members * big.numel() * 4 / seconds / 1e9, latency_s * 1e6


def run_rank(args: argparse.Namespace) -> None:
    torch = importlib.import_module("torch")
    dist = importlib.import_module("torch.distributed")
    plan = json.loads(Path(args.plan).read_text())
    device = f"cuda:{args.device}" if args.backend == "nccl" else "cpu"
    if args.backend == "nccl":
        torch.cuda.set_device(args.device)
    sync: Callable[[], None] = torch.cuda.synchronize if args.backend == "nccl" else (lambda: None)
    dist.init_process_group(args.backend, init_method=f"tcp://{args.master}:{args.port}", rank=args.rank,
                            world_size=args.world, timeout=datetime.timedelta(seconds=args.timeout))
    results: list[dict[str, Any]] = []
    try:
        for i, probe in enumerate(plan["probes"]):
            ranks = [int(r) for r in probe["ranks"]]
            group = dist.new_group(ranks) if probe["kind"] == "allreduce" else None  # collective: every rank
            if args.rank in ranks:
                if probe["kind"] in ("h2d", "d2h"):
                    bw, lat = _copy(torch, device, probe["kind"], plan["size_bytes"], plan["iters"], sync)
                elif probe["kind"] == "p2p":
                    bw, lat = _p2p(dist, torch, device, args.rank, (ranks[0], ranks[1]), plan["size_bytes"],
                                   plan["iters"], sync)
                else:
                    bw, lat = _allreduce(dist, torch, device, group, len(ranks), plan["size_bytes"], plan["iters"],
                                         sync)
                if args.rank == ranks[0]:
                    results.append({"probe": i, "bandwidth_gb_s": bw, "latency_us": lat})
            dist.barrier()
    finally:
        dist.destroy_process_group()
    Path(args.out, f"rank{args.rank}.json").write_text(json.dumps(results))


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m topology.bench.worker")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--master", default="127.0.0.1", help="rank 0's address (another node's, between nodes)")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--device", type=int, help="the GPU this rank uses (default: its rank)")
    p.add_argument("--backend", choices=["gloo", "nccl"], required=True)
    p.add_argument("--plan", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--timeout", type=float, default=300.0)
    args = p.parse_args()
    if args.device is None:
        args.device = args.rank
    run_rank(args)


if __name__ == "__main__":
    main()
