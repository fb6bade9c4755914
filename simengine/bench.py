"""`python -m pools engine-bench`: the simulated engine measured on the wall clock, at time scale 1.

1. TP across sockets vs inside an NVLink island: TTFT and TPOT seen by a client, and the ratio
   the cost model predicts.
2. PD: the same request prefilled on one engine and decoded on another in the same island, then
   on another node (KV over the network).
3. 200 concurrent streams against one engine process: achieved requests/s, tokens/s and the
   engine's CPU seconds (from /proc).

Every engine is a real process on loopback; the client is wire.client's (httpx), SSE events
split by wire.sse and timed as they are read.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from typing import Any

from physics import catalog, costmodel
from simengine.cli import link_of_kind
from wire.client import AsyncClient
from wire.processes import ChildError, Output, ReadyLine
from wire.sse import DONE, SseSplitter
from wire.supervisor import Child

MODEL, GPU = "llama-3.1-8b", "h100-sxm"


def _start(*args: str) -> tuple[Child, str]:
    proc = Child([sys.executable, "-m", "pools", "sim-engine", "--port", "0", *args], name="engine",
                 ready=ReadyLine("ready:"), stderr=Output.DEVNULL).start()
    try:
        line = proc.wait_ready(30, poll_s=0.2)
    except ChildError:  # stopped
        raise RuntimeError("engine did not start") from None
    return proc, line.split("ready:")[1].strip().removesuffix("/v1")


def _stop(proc: Child) -> None:
    proc.stop()  # SIGTERM, SIGKILL after 10 s


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _request(base: str, path: str, body: dict[str, Any]) -> tuple[float | None, list[float], bytes]:
    """POST; returns (time to the first SSE event, event arrival times, body) on the wall clock."""
    times: list[float] = []
    parts: list[bytes] = []
    sse = SseSplitter()
    async with AsyncClient(base, timeout_s=None, max_idle=0) as client:
        start = time.perf_counter()
        async with client.stream("POST", path, json_body=body) as answer:
            async for piece in answer.chunks():
                now = time.perf_counter() - start
                parts.append(piece)
                times.extend(now for payload in sse.feed(piece) if payload != DONE)
    return (times[0] if times else None), times, b"".join(parts)


def _json_body(raw: bytes) -> dict[str, Any]:
    return json.loads(raw)  # type: ignore[no-any-return]


async def _ttft_tpot(base: str, n: int = 5) -> tuple[float, float]:
    ttfts, tpots = [], []
    for i in range(n):
        first, times, _ = await _request(base, "/v1/completions", {
            "model": MODEL, "prompt": "island " * 8000, "max_tokens": 32, "stream": True, "seed": i})
        assert first is not None
        ttfts.append(first * 1000)
        tpots.append((times[-1] - times[0]) * 1000 / (len(times) - 1))
    return statistics.median(ttfts), statistics.median(tpots)


def tp_crossing() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("nvlink", "sys"):
        proc, base = _start("--model", MODEL, "--gpu", GPU, "--tp", "2", "--tp-link", kind)
        try:
            out[kind] = asyncio.run(_ttft_tpot(base))
        finally:
            _stop(proc)
    m, g = catalog.model(MODEL), catalog.gpu(GPU)
    links = {k: link_of_kind(k, GPU) for k in ("nvlink", "sys")}
    out["model_ttft_ratio"] = costmodel.prefill_ms(m, g, 2, links["sys"], 8000) / costmodel.prefill_ms(
        m, g, 2, links["nvlink"], 8000)
    out["model_tpot_ratio"] = costmodel.decode_step_ms(m, g, 2, links["sys"], 1, 8000) / costmodel.decode_step_ms(
        m, g, 2, links["nvlink"], 1, 8000)
    return out


def pd_paths() -> dict[str, float]:
    common = ("--model", "llama-3.1-70b", "--gpu", GPU, "--tp", "4", "--topology", "configs/clusters/local-sim.yaml")
    prefill, pbase = _start(*common, "--role", "prefill", "--placement", '{"node": "h100-0", "gpus": [0, 1, 2, 3]}')
    near, nbase = _start(*common, "--role", "decode", "--placement", '{"node": "h100-0", "gpus": [4, 5, 6, 7]}')
    far, fbase = _start(*common, "--role", "decode", "--placement", '{"node": "h100-1", "gpus": [0, 1, 2, 3]}')
    prompt = "kv " * 16000
    out = {}
    try:
        for name, base in (("same_island", nbase), ("cross_node", fbase)):
            start = time.perf_counter()
            _, _, raw = asyncio.run(_request(pbase, "/v1/completions", {
                "model": "llama-3.1-70b", "prompt": prompt, "max_tokens": 1,
                "kv_transfer_params": {"do_remote_decode": True}}))
            prefill_s = time.perf_counter() - start
            params = _json_body(raw)["kv_transfer_params"]
            first, _, _ = asyncio.run(_request(base, "/v1/completions", {
                "model": "llama-3.1-70b", "prompt": prompt, "max_tokens": 4, "stream": True,
                "kv_transfer_params": params}))
            assert first is not None
            out[f"{name}_ttft_ms"] = (prefill_s + first) * 1000
    finally:
        for p in (prefill, near, far):
            _stop(p)
    return out


def concurrent_streams(n: int = 200, max_tokens: int = 64) -> dict[str, float]:
    proc, base = _start("--model", MODEL, "--gpu", GPU, "--tp", "2")

    async def run() -> list[int]:
        results = await asyncio.gather(*(_request(base, "/v1/completions", {
            "model": MODEL, "prompt": f"stream {i}", "max_tokens": max_tokens, "stream": True}) for i in range(n)))
        return [len(times) for _, times, _ in results]

    try:
        cpu0, t0 = _cpu_s(proc.pid), time.perf_counter()
        chunks = asyncio.run(run())
        wall, cpu = time.perf_counter() - t0, _cpu_s(proc.pid) - cpu0
    finally:
        _stop(proc)
    complete = sum(1 for c in chunks if c >= max_tokens)
    return {"streams": n, "completed": complete, "wall_s": round(wall, 3), "requests_per_s": round(n / wall, 1),
            "tokens_per_s": round(n * max_tokens / wall), "engine_cpu_s": round(cpu, 3),
            "engine_cpu_share": round(cpu / wall, 3)}


def main(fmt: str) -> int:
    tp = tp_crossing()
    pd = pd_paths()
    streams = concurrent_streams()
    doc = {"tp_crossing": tp, "pd": pd, "streams": streams}
    if fmt == "json":
        print(json.dumps(doc))
        return 0
    (ti, pi), (tx, px) = tp["nvlink"], tp["sys"]
    print(f"TP=2 llama-3.1-8b on H100, 8k prompt (wall clock, medians of 5): TTFT {ti:.1f} ms in an NVLink island, "
          f"{tx:.1f} ms across sockets (x{tx / ti:.2f}; cost model x{tp['model_ttft_ratio']:.2f}); TPOT {pi:.2f} -> "
          f"{px:.2f} ms (x{px / pi:.2f}; cost model x{tp['model_tpot_ratio']:.2f})")
    print(f"PD llama-3.1-70b TP=4, 16k prompt: prefill + decode TTFT {pd['same_island_ttft_ms']:.0f} ms with the "
          f"decode in the same island, {pd['cross_node_ttft_ms']:.0f} ms on another node")
    print(f"{streams['streams']} concurrent streams x 64 tokens: {streams['completed']} completed in "
          f"{streams['wall_s']} s ({streams['requests_per_s']} req/s, {streams['tokens_per_s']} tokens/s); engine "
          f"CPU {streams['engine_cpu_s']} s ({streams['engine_cpu_share'] * 100:.0f}% of one core)")
    return 0


def add_parser(sub: Any) -> None:
    """`engine-bench` of `python -m pools` (also `bench engine`)."""
    p = sub.add_parser("engine-bench", help="the simulated engine on the wall clock (TP, PD, 200 streams); "
                                            "also `bench engine`")
    p.add_argument("--format", choices=["json", "text"], default="text")
    p.set_defaults(func=lambda args: main(args.format))
