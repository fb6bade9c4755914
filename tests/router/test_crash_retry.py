"""An engine that dies with streams it has accepted but not started (their response heads sent,
no token yet): the router sends them to another replica, and the client gets every token once.
An engine sends a stream's head before the request leaves its queue, so "not started" has to
mean "no token relayed", not "no head"."""

from __future__ import annotations

import os
import signal
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from router.config import DEV_ADMIN_KEY, DEV_KEY, sha256
from tests.support.clients import openai_client
from tests.support.engines import EngineProcess, fault, running_router, start_engine, stop_engine
from tests.support.wait import wait_until
from wire.text import TokenText

pytestmark = pytest.mark.integration
MODEL = "llama-3.1-8b"
TOKENS = 12


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[dict[str, Any]]:
    common = ("--model", MODEL, "--gpu", "h100-sxm", "--time-scale", "0.05")
    engines: dict[str, EngineProcess] = {}
    try:
        for name in ("a", "b"):
            engines[name] = start_engine(*common, "--engine-id", name)
        config = {
            "port": 0, "require_keys": True,
            "keys": [{"tenant": "dev", "key_sha256": sha256(DEV_KEY)}],
            "admin_keys": [{"tenant": "ops", "key_sha256": sha256(DEV_ADMIN_KEY)}],
            "profiles": {"standard": {"picker": "round-robin-picker"}},
            "upstream": {"retries": 2, "breaker_failures": 1, "breaker_open_s": 30},
            "replicas": [{"replica_id": name, "url": e.base, "model": MODEL, "pool": "mixed", "role": "mixed"}
                         for name, e in engines.items()],
        }
        with running_router(config, tmp_path) as (_proc, url):
            yield {"url": url, "engines": engines}
    finally:
        for e in engines.values():
            stop_engine(e)


def _running(engine: EngineProcess) -> float:
    with urllib.request.urlopen(f"{engine.base}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")))


def _stream(url: str, seed: int) -> tuple[str, str]:
    """(the replica that served it, the text), through the openai client."""
    client = openai_client(url, DEV_KEY)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": f"request {seed}"}], max_tokens=TOKENS, seed=seed,
        stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    return raw.headers["x-isle-replica"], text


def _expected(seed: int) -> str:
    words = TokenText(seed)
    return "".join(words.next() for _ in range(TOKENS))


def test_streams_an_engine_accepted_but_never_started_go_to_another_replica(pair: dict[str, Any]) -> None:
    a = pair["engines"]["a"]
    fault(a, {"stall_s": 60})  # a takes requests (and answers their heads) but produces no token
    seeds = list(range(100, 106))
    with ThreadPoolExecutor(len(seeds)) as pool:
        futures = [pool.submit(_stream, pair["url"], s) for s in seeds]

        def a_holds_the_rest() -> float:  # b serves its share; a holds the rest without a token
            waiting = _running(a)
            return waiting if waiting and waiting + sum(f.done() for f in futures) == len(seeds) else 0.0

        waiting = wait_until(a_holds_the_rest, 20, "a holds every request b did not serve")
        assert waiting >= 1 and not any(f.done() and f.exception() for f in futures)
        os.kill(a.proc.pid, signal.SIGKILL)
        results = [f.result() for f in futures]
    assert [replica for replica, _ in results] == ["b"] * len(seeds)
    assert [text for _, text in results] == [_expected(s) for s in seeds]  # every token, once
