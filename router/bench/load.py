"""Load generation for the router benchmark: wrk at saturation, an open-loop fixed-rate client for
added latency, concurrent streams for time to first chunk, and CPU of a process tree."""

from __future__ import annotations

import asyncio
import os
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

AUTH = "Bearer isle-dev-key"
CHAT = '{"model":"fake","messages":[{"role":"user","content":"Hello, how are you?"}],"max_tokens":16}'
STREAM = '{"model":"fake","messages":[{"role":"user","content":"Hello"}],"max_tokens":64,"stream":true}'


def tree_pids(pid: int) -> list[int]:
    """A process and its descendants (nginx forks workers; uvicorn and granian spawn them)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                children.setdefault(int(fields[1]), []).append(int(entry))
            except OSError:
                continue
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, []))
    return found


def tree_cpu_s(pid: int) -> float:
    """user+sys seconds of a process and its descendants."""
    total = 0.0
    for p in tree_pids(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            continue
    return total


def wrk(port: int, body: str, seconds: float, connections: int = 64) -> float:
    """Requests per second at saturation."""
    script = ("wrk.method = 'POST'\nwrk.headers['Content-Type'] = 'application/json'\n"
              f"wrk.headers['Authorization'] = '{AUTH}'\nwrk.body = [[{body}]]\n")
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(script)
    try:
        out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--timeout", "10s", "-s", f.name,
                              f"http://127.0.0.1:{port}/v1/chat/completions"], capture_output=True, text=True,
                             timeout=seconds + 30, check=True).stdout
    finally:
        Path(f.name).unlink()
    match = re.search(r"Requests/sec:\s+([\d.]+)", out)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    if match is None or non2xx is not None:
        raise RuntimeError(f"wrk against port {port} failed or got errors:\n{out}")
    return float(match.group(1))


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer


def _close(conns: list[_Conn]) -> None:
    for c in conns:
        c.writer.close()


async def _one(port: int, pool: list[_Conn], body: bytes, stream: bool) -> tuple[float, float]:
    """(seconds to the first body byte, seconds to the end) of one request on a keep-alive conn;
    a pooled connection the proxy closed meanwhile is replaced once."""
    start = time.perf_counter()
    for attempt in range(2):
        reused = bool(pool) and attempt == 0
        conn = pool.pop() if reused else _Conn(*await asyncio.open_connection("127.0.0.1", port))
        try:
            first, end, keep = await _exchange(conn, body)
        except (ValueError, OSError, asyncio.IncompleteReadError):
            conn.writer.close()
            if reused:
                continue
            raise
        if keep:
            pool.append(conn)
        else:
            conn.writer.close()
        return first - start if first else 0.0, end - start
    raise RuntimeError("unreachable")


async def _exchange(conn: _Conn, body: bytes) -> tuple[float, float, bool]:
    """Absolute perf_counter times of the first body byte and of the end; keep-alive or not."""
    conn.writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                      b"authorization: " + AUTH.encode() + b"\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body))
    headers: dict[str, str] = {}
    if not (await conn.reader.readline()).startswith(b"HTTP/1.1 2"):
        raise ValueError("not a 2xx response")
    while (line := await conn.reader.readline()) not in (b"\r\n", b""):
        k, _, v = line.decode().partition(":")
        headers[k.strip().lower()] = v.strip()
    first = 0.0
    if "content-length" in headers:
        await conn.reader.readexactly(int(headers["content-length"]))
        first = time.perf_counter()
    else:
        while True:
            size = int((await conn.reader.readline()).strip(), 16)
            if size == 0:
                await conn.reader.readline()
                break
            data = await conn.reader.readexactly(size + 2)
            if not first and b"data: {" in data:
                first = time.perf_counter()
    return first, time.perf_counter(), headers.get("connection", "").lower() != "close"


async def open_loop(port: int, rate: float, seconds: float, warmup_s: float = 1.0,
                    peer: int | None = None) -> tuple[list[float], list[float]]:
    """Latencies (s) of requests sent at a fixed rate, measured from their scheduled send time.
    With `peer`, the same rate also goes to that port, interleaved (half a period apart): both
    series see the same moments of a shared machine, so their difference is the proxy's."""
    targets = [port] if peer is None else [port, peer]
    pools: list[list[_Conn]] = [[] for _ in targets]
    body = CHAT.encode()
    tasks: list[list[asyncio.Task[tuple[float, float]]]] = [[] for _ in targets]
    start = time.perf_counter()
    n = int(rate * (seconds + warmup_s))
    for i in range(n):
        for j, target in enumerate(targets):
            at = start + (i + j / 2) / rate
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
            tasks[j].append(asyncio.create_task(_one(target, pools[j], body, False)))
    skip = int(rate * warmup_s)
    out = [[r[1] for r in (await asyncio.gather(*ts))[skip:]] for ts in tasks]
    _close([c for pool in pools for c in pool])
    return out[0], (out[1] if peer is not None else [])


async def streams(port: int, concurrency: int, rounds: int, peer: int | None = None) -> tuple[list[float], list[float]]:
    """Time to first chunk (s) of `concurrency` simultaneous streams, `rounds` times; with `peer`,
    a round against it after each (alternating: both see the same phases of the machine)."""
    targets = [port] if peer is None else [port, peer]
    out: list[list[float]] = [[] for _ in targets]
    pools: list[list[list[_Conn]]] = [[[] for _ in range(concurrency)] for _ in targets]
    for _ in range(rounds):
        for j, t in enumerate(targets):
            res = await asyncio.gather(*(_one(t, pools[j][i], STREAM.encode(), True) for i in range(concurrency)))
            out[j].extend(r[0] for r in res)
    _close([c for conns in pools for pool in conns for c in pool])
    return out[0], (out[1] if peer is not None else [])


async def _delivery(port: int, chunks: int, itl_ms: float, out: list[float]) -> None:
    body = ('{"model":"fake","messages":[{"role":"user","content":"Hello"}],"max_tokens":'
            f'{chunks},"stream":true,"itl_ms":{itl_ms:g}}}').encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"authorization: " + AUTH.encode() + b"\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body))
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        while True:
            size = int((await reader.readline()).strip(), 16)
            if size == 0:
                break
            data = await reader.readexactly(size + 2)
            now_us = time.monotonic_ns() // 1000
            for stamp in STAMP.findall(data):
                out.append((now_us - int(stamp)) / 1e6)
    finally:
        writer.close()


STAMP = re.compile(rb'"content":"(\d+)"')


async def chunk_delivery(port: int, concurrency: int, chunks: int, itl_ms: float, peer: int | None = None,
                         rounds: int = 1) -> tuple[list[float], list[float]]:
    """Per-chunk delivery times (s: receipt minus the backend's send stamp) of `concurrency`
    streams whose chunks the backend emits on the same `itl_ms` grid (synchronised streams);
    with `peer`, alternating rounds against it."""
    targets = [port] if peer is None else [port, peer]
    out: list[list[float]] = [[] for _ in targets]
    for _ in range(rounds):
        for j, t in enumerate(targets):
            await asyncio.gather(*(_delivery(t, chunks, itl_ms, out[j]) for _ in range(concurrency)))
    return out[0], (out[1] if peer is not None else [])


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def median(values: list[float]) -> float:
    return statistics.median(values)
