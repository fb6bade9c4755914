"""`python -m loadtest run` against the real router on loopback in front of simulated engines, as a
user runs it: every request completes, counts and classes add up, tier and replica are recorded."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadtest.live.client import Target, UsageError, loopback_target
from loadtest.live.run import _Stream, load_classes
from router.config import DEV_ADMIN_KEY, DEV_KEY, sha256
from tests.conftest import ROOT
from tests.support.engines import EngineProcess, running_router, start_engine, stop_engine

pytestmark = pytest.mark.integration
MODEL = "llama-3.1-8b"
MIX = "interactive=0.2,standard=0.6,batch=0.2"


def loadtest(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loadtest", "run", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout_s, check=False)


@pytest.fixture(scope="module")
def router_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    common = ("--model", MODEL, "--gpu", "h100-sxm", "--time-scale", "0.02", "--topology",
              "configs/clusters/local-sim.yaml")
    specs = {"m1": ("mixed", {"node": "h100-0", "gpus": [0]}), "m2": ("mixed", {"node": "h100-1", "gpus": [0]}),
             "p1": ("prefill", {"node": "h100-0", "gpus": [1]}), "d1": ("decode", {"node": "h100-0", "gpus": [2]})}
    engines: dict[str, EngineProcess] = {}
    try:
        for name, (role, placement) in specs.items():
            engines[name] = start_engine(*common, "--role", role, "--placement", json.dumps(placement),
                                         "--engine-id", name)
        config = {
            "port": 0, "require_keys": True, "topology": "configs/clusters/local-sim.yaml",
            "keys": [{"tenant": "dev", "key_sha256": sha256(DEV_KEY)}],
            "admin_keys": [{"tenant": "ops", "key_sha256": sha256(DEV_ADMIN_KEY)}],
            "default_slo_class": "standard", "pd": {"enabled": True, "min_prompt_tokens": 600},
            "replicas": [{"replica_id": name, "url": engines[name].base, "model": MODEL, "pool": f"pool-{role}",
                          "role": role, "node": p["node"], "gpus": p["gpus"], "tier": "local", "gpu_model": "h100-sxm",
                          "catalog_model": MODEL} for name, (role, p) in specs.items()],
        }
        with running_router(config, tmp_path_factory.mktemp("router")) as (_, url):
            yield url.removesuffix("/v1")
    finally:
        for engine in engines.values():
            stop_engine(engine)


def test_a_synthetic_load_completes_with_classes_tiers_and_replicas(router_url: str, tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    done = loadtest("--target", router_url, "--workload",
                    "synthetic:poisson,rate=10,prompt=uniform:64:1200,output=uniform:4:24,requests=30,seed=7",
                    "--class-mix", MIX, "--timeout", "20", "--format", "json", "--out", str(out))
    assert done.returncode == 0, done.stderr
    summary: dict[str, Any] = json.loads(done.stdout)
    assert summary["requests"] == summary["completed"] == 30
    assert summary["outcomes"] == {"ok": 30}
    assert {name: c["requests"] for name, c in summary["per_class"].items()} == {
        "interactive": 6, "standard": 18, "batch": 6}
    assert summary["model"] == MODEL and summary["workload"]["requests"] == 30
    assert summary["ttft_ms"]["median"] > 0 and summary["tpot_ms"]["median"] > 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["index"] for r in rows) == list(range(30))
    assert all(r["tier"] and r["replica"] in ("m1", "m2", "d1") and r["status"] == 200 for r in rows)
    long = [r for r in rows if r["prompt_tokens"] >= 600]
    # a long prompt goes PD, or whole to a mixed replica when that is predicted sooner (the one
    # prefill replica busy with another long prompt); never to a mixed replica via a prefill
    split = [r for r in long if r["prefill_replica"]]
    assert split and all(r["prefill_replica"] == "p1" and r["replica"] == "d1" for r in split)
    assert all(r["replica"] in ("m1", "m2") for r in long if not r["prefill_replica"])
    short = [r for r in rows if r["prompt_tokens"] < 600]
    assert short and all(r["replica"] in ("m1", "m2") and not r["prefill_replica"] for r in short)
    for r in rows:  # lengths as the workload asked (ignore_eos, max_tokens) and one ITL per later token
        assert 4 <= r["output_tokens"] <= 24 and len(r["itls_s"]) == r["output_tokens"] - 1


def test_text_summary_and_a_shed_or_refused_key(router_url: str) -> None:
    done = loadtest("--target", router_url + "/v1", "--workload", "azure-conv", "--max-requests", "5",
                    "--rate-scale", "20", "--timeout", "20")
    assert done.returncode == 0, done.stderr
    assert "Successful requests:" in done.stdout and "azure-conv: 5 requests" in done.stdout
    refused = loadtest("--target", router_url, "--workload", "azure-conv", "--max-requests", "2",
                       "--api-key", "wrong", "--model", MODEL, "--format", "json")
    assert refused.returncode == 1
    assert json.loads(refused.stdout)["outcomes"] == {"error:401": 2}


@pytest.mark.parametrize("target", ["http://10.1.2.3:8000", "http://example.com:8000", "http://[2001:db8::1]:80",
                                    "http://0.0.0.0:8000", "https://127.0.0.1:8000"])
def test_a_target_off_this_machine_is_refused(target: str) -> None:
    done = loadtest("--target", target, "--workload", "azure-conv", "--max-requests", "1")
    assert done.returncode == 2
    assert "loadtest run:" in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == ""


def test_a_bad_workload_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,12,x\n")
    done = loadtest("--target", "http://127.0.0.1:9", "--workload", str(bad))
    assert done.returncode == 2
    assert done.stderr.strip() == f"loadtest run: {bad}:2: GeneratedTokens is 'x', not a whole number"
    unbounded = loadtest("--target", "http://127.0.0.1:9", "--workload", "synthetic:poisson,rate=5")
    assert unbounded.returncode == 2 and "needs a bound" in unbounded.stderr


# the driver's parts, without a server
@pytest.mark.parametrize(("url", "expected"), [
    ("http://127.0.0.1:8000", ("127.0.0.1", 8000)), ("127.0.0.9:81/v1", ("127.0.0.9", 81)),
    ("http://localhost:8000/v1", ("localhost", 8000)), ("http://[::1]:9", ("::1", 9)),
    ("http://[::ffff:127.0.0.1]:9", ("::ffff:127.0.0.1", 9)), ("http://127.0.0.1", ("127.0.0.1", 80))])
def test_loopback_targets(url: str, expected: tuple[str, int]) -> None:
    assert loopback_target(url) == expected


@pytest.mark.parametrize("url", ["http://192.168.1.5:8000", "http://localhost.example.com", "http://[::]:80",
                                 "http://127.0.0.1:99999", "ftp://127.0.0.1"])
def test_other_targets_are_refused(url: str) -> None:
    with pytest.raises(UsageError):
        loopback_target(url)


@settings(max_examples=60, deadline=None)
@given(events=st.lists(st.text(max_size=20), min_size=1, max_size=12), cuts=st.lists(st.integers(0, 2000)))
def test_sse_decodes_whatever_the_read_boundaries(events: list[str], cuts: list[int]) -> None:
    sse = b"".join(b'data: {"choices":[{"delta":{"content":' + json.dumps(e).encode() + b"}}]}\n\n" for e in events)
    sse += b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":%d}}\n\ndata: [DONE]\n\n' % len(events)
    points = sorted({min(c, len(sse)) for c in cuts} | {0, len(sse)})
    stream = _Stream()
    for a, b in itertools.pairwise(points):
        stream.feed(sse[a:b], float(b))
    assert stream.done and not stream.error
    assert len(stream.token_times) == sum(1 for e in events if e) and stream.usage["completion_tokens"] == len(events)


def test_classes_files(tmp_path: Path) -> None:
    assert set(load_classes(None)) == {"interactive", "standard", "batch"}
    assert load_classes(str(ROOT / "configs/local.yaml"))["batch"].max_concurrency == 64
    listed = tmp_path / "classes.yaml"
    listed.write_text("- {name: gold, priority: 0, ttft_ms: 100, tpot_ms: 10}\n")
    assert load_classes(str(listed))["gold"].ttft_ms == 100
    listed.write_text("- {name: gold, priority: 0}\n")
    with pytest.raises(UsageError, match="ttft_ms: Field required"):
        load_classes(str(listed))


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A loopback server that accepts and reads but never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                held.append(server.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_bounded_in_time_stragglers_are_timeouts(silent_server: int, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    started = time.monotonic()
    done = loadtest("--target", f"http://127.0.0.1:{silent_server}", "--model", MODEL, "--workload",
                    "synthetic:constant,rate=10,prompt=16,output=4,requests=100", "--duration", "1", "--timeout", "0.5",
                    "--format", "json", "--out", str(out))
    assert time.monotonic() - started < 10
    assert done.returncode == 1  # nothing completed
    summary = json.loads(done.stdout)
    # ten planned in the second; one the client reaches after --duration (a loaded machine's lag)
    # is counted as not sent, never lost
    assert summary["workload"]["requests"] == 10 and summary["unsent"] <= 3
    assert summary["outcomes"] == {"timeout": 10 - summary["unsent"]}
    assert all(json.loads(line)["sent_s"] < 1.0 for line in out.read_text().splitlines())


def test_the_client_times_each_event_as_it_comes_on_one_reused_connection() -> None:
    """Three streams in turn from a server that spaces its events 50 ms apart: one connection,
    and each token's time is when its event arrived (the ITLs see the spacing)."""
    accepted: list[asyncio.Event] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(ended := asyncio.Event())
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n")
                              if h.lower().startswith(b"content-length"))
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"transfer-encoding: chunked\r\n\r\n")
                for word in ("a", "b", "c"):
                    event = b'data: {"choices":[{"delta":{"content":"%s"}}]}\n\n' % word.encode()
                    writer.write(b"%x\r\n%b\r\n" % (len(event), event))
                    await writer.drain()
                    await asyncio.sleep(0.05)
                done = b"data: [DONE]\n\n"
                writer.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(done), done))
        writer.close()
        await writer.wait_closed()
        ended.set()

    async def run() -> list[_Stream]:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        target = Target("127.0.0.1", server.sockets[0].getsockname()[1])
        streams = []
        try:
            for _ in range(3):
                stream = _Stream()
                async with target.post("/v1/chat/completions", b"{}", {"content-type": "application/json"}) as answer:
                    assert answer.status == 200
                    await target.body(answer, stream.feed)
                streams.append(stream)
        finally:
            await target.aclose()
            server.close()
            for ended in accepted:
                await asyncio.wait_for(ended.wait(), 5)
        return streams

    streams = asyncio.run(run())
    assert len(accepted) == 1
    for stream in streams:
        assert stream.done and not stream.error and len(stream.token_times) == 3
        # each time is when its event came: they spread over the server's spacing (0.1 s in all; a
        # loaded machine may hand two events over at once, so no single gap is promised)
        assert stream.token_times[-1] - stream.token_times[0] >= 0.045
        assert all(b >= a for a, b in itertools.pairwise(stream.token_times))
