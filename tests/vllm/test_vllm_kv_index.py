"""The router's prefix-cache index against a real vLLM CPU server (issue 33's vLLM tier): vLLM
publishes its KV events (`--kv-events-config`, zmq) to the router's subscriber; the router keys
each request from the server's own tokenizer (`POST /tokenize`, `router.kvtokens`) and predicts,
before sending it, how many of its tokens vLLM will read from its cache. Over a scripted
sequence of shared-prefix requests the prediction is vLLM's own `vllm:prefix_cache_hits` (and
its keyed tokens are `vllm:prefix_cache_queries`), per request and in total; then, on a KV
cache of a few dozen blocks (`--num-gpu-blocks-override`), unrelated prompts evict the shared
prefix, the index hears each `BlockRemoved` within a second, and its next lookup predicts the
miss that vLLM confirms.

The router runs in-process (the real `router.server.Router`, its real HTTP front door and
request path) so the test can read its index; vLLM runs as the launcher starts it, on core 0.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from control.replicas.vllm.command import VllmServer
from control.replicas.vllm.process import VllmProcess, free_port
from kvblocks.events import BlockRemoved, EventBatch
from router.cli import table_from_config
from router.config import RouterConfig
from router.server import Router
from tests.support.ports import free_ports
from tests.vllm.conftest import MODEL_DIR, PYTHON, READY_TIMEOUT_S, SERVED

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

BLOCK = 32
"""vLLM's CPU attention takes block sizes in multiples of 32."""
BLOCKS = 48
"""The whole KV cache (`--num-gpu-blocks-override`; one is vLLM's null block): 1,504 tokens, the
scripted sequence's ~30 blocks and a request's own."""
SYSTEM = ("You are the support assistant of a network operations team. Answer questions about link "
          "failures, routing tables, interconnect topology and replica placement. Be brief and precise. "
          "Quote the runbook section that applies, and say which replica or link is at fault. ") * 3
USERS = ["The NVLink between GPU 2 and GPU 3 shows replay errors; what should I drain first?",
         "Replica m4 answers slowly since the switch firmware update. Where do I look?",
         "How do I read the island map after a node lost two of its eight GPUs?",
         "Which metric tells me the prefix cache is helping the decode pool?"]
SCRIPT: list[tuple[int, ...]] = [(0,), (1,), (0,), (2,), (1,), (3,), (0, 2), (0, 2)]
"""Users by index, one chat each: a new user shares the system prompt, a repeat all its prompt,
the last two a second turn (the first turn's answer included)."""
FILLER = [f"Log excerpt {k}: " + " ".join(f"port{k}{j} flapped at {j:02d}:{k:02d} after CRC errors" for j in range(24))
          for k in range(5)]
"""Unrelated prompts of ~450 tokens (14 blocks) each: together more than the cache."""


@pytest.fixture(scope="module")
def ports() -> tuple[int, int]:
    sub, replay = free_ports(2)
    return sub, replay


@pytest.fixture(scope="module")
def vllm(ports: tuple[int, int], tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmProcess]:
    sub, replay = ports
    events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{sub}",
              "replay_endpoint": f"tcp://127.0.0.1:{replay}", "topic": "kv0"}
    server = VllmServer(replica_id="kv0", model=str(MODEL_DIR), served_model_name=SERVED, port=free_port(),
                        max_model_len=512, cpu_threads_bind="0", enforce_eager=True, offline=True,
                        kv_cache_memory_bytes=64 << 20,
                        extra_args=("--enable-prefix-caching", "--block-size", str(BLOCK),
                                    "--num-gpu-blocks-override", str(BLOCKS),
                                    "--kv-events-config", json.dumps(events)))
    proc = VllmProcess(server, str(PYTHON), log_path=tmp_path_factory.mktemp("kv") / "kv0.log",
                       ready_timeout_s=READY_TIMEOUT_S)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def _total(text: str, name: str) -> float:
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines()
               if x.startswith((name + "_total{", name + "_total ")))


class Bench:
    """The in-process router in front of the vLLM server, and what the test reads of both."""

    def __init__(self, router: Router, http: httpx.AsyncClient, engine: str) -> None:
        self.router, self.http, self.engine = router, http, engine
        self.removed: list[tuple[float, float]] = []
        """(the engine's timestamp on a batch with a BlockRemoved, when the index took it)."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.router.port}"

    async def settled(self) -> None:
        """The index took every batch the engine sent (none for 0.3 s)."""
        kv = self.router.kvindex
        assert kv is not None
        last, quiet = -1, 0
        while quiet < 6:
            await asyncio.sleep(0.05)
            quiet = quiet + 1 if kv.batches == last else 0
            last = kv.batches

    async def counters(self) -> tuple[float, float, float, float]:
        """(router's expected hit tokens, vLLM's hits, router's keyed tokens, vLLM's queries)."""
        ours = (await self.http.get(self.url + "/metrics")).text
        theirs = (await self.http.get(self.engine + "/metrics")).text
        return (_total(ours, "isle_router_prefix_hit_tokens"), _total(theirs, "vllm:prefix_cache_hits"),
                _total(ours, "isle_router_prefix_query_tokens"), _total(theirs, "vllm:prefix_cache_queries"))

    async def send(self, body: dict[str, Any], path: str = "/v1/chat/completions") -> tuple[list[float], str, float]:
        """One request after the index settled: (the deltas of `counters`, its text, when it ended)."""
        await self.settled()
        before = await self.counters()
        resp = await self.http.post(self.url + path, json={"model": SERVED, "max_tokens": 4, "temperature": 0.0,
                                                           "ignore_eos": True, **body})
        ended = time.time()
        assert resp.status_code == 200, resp.text
        choice = resp.json()["choices"][0]
        text = choice["message"]["content"] if "message" in choice else choice["text"]
        for _ in range(40):  # vLLM's counters follow its step's stats
            after = await self.counters()
            if after[3] > before[3]:
                break
            await asyncio.sleep(0.05)
        return [a - b for a, b in zip(after, before, strict=True)], text, ended


def _messages(turns: tuple[int, ...], answers: dict[int, str]) -> list[dict[str, str]]:
    out = [{"role": "system", "content": SYSTEM}]
    for k, user in enumerate(turns):
        out.append({"role": "user", "content": USERS[user]})
        if k < len(turns) - 1:
            out.append({"role": "assistant", "content": answers[user]})
    return out


async def _scenario(vllm: VllmProcess, sub: int, replay: int, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    config = RouterConfig.model_validate({
        "port": 0, "require_keys": False, "scrape_interval_s": 0.5,
        "kv_events": {"endpoint": f"tcp://127.0.0.1:{sub}", "block_size": BLOCK},
        "default_profile": {"scorers": {"kv-cache-scorer": 1.0, "queue-depth-scorer": 0.1}},
        "replicas": [{"replica_id": "kv0", "url": vllm.url, "model": SERVED, "engine": "vllm",
                      "kv_events_replay": f"tcp://127.0.0.1:{replay}"}]})
    router = Router(config, table_from_config(config))
    await router.start()
    kv = router.kvindex
    assert kv is not None
    async with httpx.AsyncClient(timeout=120) as http:
        bench = Bench(router, http, vllm.url)
        take = kv.index.apply

        def apply(replica: str, batch: EventBatch) -> None:
            take(replica, batch)
            if any(isinstance(e, BlockRemoved) for e in batch.events):
                bench.removed.append((batch.ts, time.time()))

        monkeypatch.setattr(kv.index, "apply", apply)
        try:
            return await _run(bench)
        finally:
            await router.stop()


async def _run(bench: Bench) -> dict[str, Any]:
    kv = bench.router.kvindex
    assert kv is not None
    rows: list[list[float]] = []
    answers: dict[int, str] = {}
    for turns in SCRIPT:
        deltas, text, _ = await bench.send({"messages": _messages(turns, answers)})
        answers.setdefault(turns[0], text)
        rows.append(deltas)
    shared = {"prompt": SYSTEM + USERS[0]}  # a completion of the system prompt: keyed by /tokenize's prompt form
    rows += [(await bench.send(shared, "/v1/completions"))[0] for _ in range(2)]
    first = _messages((0,), answers)
    ask = {"model": SERVED, "messages": first}
    keyed = kv.remote.known(ask)[2]
    assert keyed is not None and len(keyed.keys) >= 4
    held_before = kv.index.leading("kv0", keyed.keys)
    after_end = []  # per filler request: when the index took its last BlockRemoved, from the request's end
    for filler in FILLER:  # unrelated prompts: together more than the cache holds
        await bench.settled()
        first_new = len(bench.removed)
        end = (await bench.send({"prompt": filler}, "/v1/completions"))[2]
        await bench.settled()
        after_end += [max(seen for _, seen in bench.removed[first_new:]) - end] if bench.removed[first_new:] else []
    held_after = kv.index.leading("kv0", keyed.keys)
    miss, _, _ = await bench.send({"messages": first})
    return {"rows": rows, "removed": bench.removed, "after_end": after_end, "held": (held_before, held_after),
            "miss": miss, "blocks": kv.index.blocks("kv0"), "tokenize": dict(kv.remote.counts)}


def test_the_index_predicts_vllms_hits_and_sees_its_evictions(vllm: VllmProcess, ports: tuple[int, int],
                                                              monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    out = asyncio.run(_scenario(vllm, *ports, monkeypatch))
    (tmp_path / "figures.json").write_text(json.dumps(out, indent=1))
    lags = [seen - ts for ts, seen in out["removed"]]
    print(json.dumps({**{k: out[k] for k in ("rows", "held", "miss", "tokenize")}, "removed_batches": len(lags),
                      "max_lag_s": max(lags, default=None),
                      "seen_after_end_s": out["after_end"]}))
    rows = out["rows"]
    expected, hits, keyed, queries = (sum(r[i] for r in rows) for i in range(4))
    assert hits > 0.5 * queries  # a shared-prefix sequence: most of it read from the cache
    assert abs(expected - hits) <= 0.1 * hits and abs(keyed - queries) <= 0.1 * queries, rows
    assert all(r[0] == r[1] and r[2] == r[3] for r in rows), rows  # one at a time: per request, exactly
    held_before, held_after = out["held"]
    assert held_before >= 4 and held_after < held_before  # the system prompt's blocks were evicted
    assert lags, "vLLM published no BlockRemoved"
    assert max(lags) < 1.0, lags  # each eviction in the index within a second of vLLM's step
    assert out["after_end"] and max(out["after_end"]) < 1.0  # and within a second of the request's end
    miss = out["miss"]
    assert miss[0] == miss[1] and miss[0] < held_before * BLOCK  # the miss predicted is the miss vLLM has
