"""The router's prefix-cache index from the engines' KV events (`router.kvindex`, config
`kv_events`, the `kv-cache-scorer`): two simulated engines publish their caches; a long prompt
warmed on one of them directly is routed back to it, the router's /metrics shows what it
indexed, and the engines' own hit counters agree with the routing."""

from __future__ import annotations

import hashlib
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from isleserve.status import collect, render
from router.config import DEV_ADMIN_KEY, DEV_KEY, RouterConfig
from tests.support.engines import running_engine, running_router
from tests.support.ports import free_ports

pytestmark = pytest.mark.integration

MODEL = "llama-3.1-8b"
DOC = "Clause {n}: the tenant shall keep the premises in good repair and report any damage. "


def _engine(name: str, sub_port: int, replay: int) -> Any:
    """A simulated engine publishing its prefix cache to the router's subscriber at `sub_port`."""
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{sub_port}",
              "replay_endpoint": f"tcp://127.0.0.1:{replay}", "topic": name}
    return running_engine("--model", MODEL, "--gpu", "h100-sxm", "--time-scale", "0.01", "--engine-id", name,
                          "--enable-prefix-caching", "--kv-events-config", json.dumps(config))


def _post(url: str, content: str, key: str | None = None) -> tuple[str, dict[str, Any]]:
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": content}]}
    headers = {"content-type": "application/json", **({"authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(url + "/chat/completions", data=json.dumps(body).encode(), headers=headers)
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.headers.get("x-isle-replica", ""), json.loads(resp.read())


def _hits(base: str) -> float:
    with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith("vllm:prefix_cache_hits_total{"))


def _series(base: str, name: str) -> float:
    with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(name + "_total{"))


def _index_blocks(base: str) -> dict[str, float]:
    with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("isle_router_kv_index_blocks{"):
            out[line.split('replica="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
    return out


def test_a_cached_prefix_is_routed_to_the_engine_that_holds_it(tmp_path: Path) -> None:
    sub_port, r0, r1 = free_ports(3)
    with _engine("e0", sub_port, r0) as e0, _engine("e1", sub_port, r1) as e1:
        config = {"port": 0, "require_keys": False,
                  "admin_keys": [{"tenant": "ops", "key_sha256": hashlib.sha256(DEV_ADMIN_KEY.encode()).hexdigest()}],
                  "kv_events": {"endpoint": f"tcp://127.0.0.1:{sub_port}", "block_size": 16},
                  "default_profile": {"scorers": {"kv-cache-scorer": 1.0, "queue-depth-scorer": 0.1}},
                  "replicas": [{"replica_id": name, "url": e.base, "model": MODEL, "kv_events_replay":
                                f"tcp://127.0.0.1:{port}"} for name, e, port in (("e0", e0, r0), ("e1", e1, r1))]}
        with running_router(config, tmp_path) as (_, url):
            document = "".join(DOC.format(n=n) for n in range(60))  # ~1,300 tokens
            _post(e1.url, document + "Question: who repairs the roof?")  # warm e1 only, behind the router's back
            for _ in range(200):  # the router hears e1's events
                time.sleep(0.05)
                if _index_blocks(url.removesuffix("/v1")).get("e1", 0) >= 70:
                    break
            held = _index_blocks(url.removesuffix("/v1"))
            assert held["e0"] == 0 and held["e1"] >= 70  # ~1,290 tokens: 79 full blocks of 16
            before = _hits(e1.base)
            picked = [_post(url, document + f"Question {k}: who pays for the locks?", DEV_KEY)[0] for k in range(4)]
            assert picked == ["e1"] * 4
            assert _hits(e1.base) - before >= 4 * 1200  # each read the document from e1's cache
            seen = _series(url.removesuffix("/v1"), "isle_router_prefix_hit_blocks")
            asked = _series(url.removesuffix("/v1"), "isle_router_prefix_query_blocks")
            assert 4 * 70 <= seen <= asked  # the router counted the blocks it routed to a cache that held them
            state = collect(url.removesuffix("/v1"), DEV_ADMIN_KEY)  # what `isle status` reads and shows
            caches = {r["replica_id"]: r["prefix_cache"] for r in state["replicas"]["replicas"]}
            assert caches["e1"]["blocks"] >= 70 and caches["e1"]["hit_ratio"] > 0.85 and caches["e0"]["blocks"] == 0
            lines = {line.split()[0]: line for line in render(state).splitlines()[1:] if line.startswith("  e")}
            assert "cache 0 blocks, hits -" in lines["e0"] and ", hits 9" in lines["e1"]


SYSTEM = "You are the leasing office's assistant. " + "".join(DOC.format(n=n) for n in range(40))  # ~870 tokens
USERS = [f"Tenant {k}: my flat {k}0{k} has a leak under the sink and the landlord has not answered for {k} days. "
         * (k + 1) for k in range(4)]
SCRIPT = [(0,), (1,), (0,), (2,), (1,), (3,), (0,), (2, 1)]
"""Users by index, one request each: a new user shares the system prompt; a repeated one, all of
its prompt; the last adds a turn after user 2's."""


def _scrape(base: str) -> str:
    with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
        text: str = resp.read().decode()
    return text


def _total(text: str, name: str) -> float:
    """A counter's value summed over its labels."""
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines()
               if x.startswith((name + "_total{", name + "_total ")))


def _settled(base: str) -> None:
    """The router's index took every event batch its engines sent (none came for 0.15 s)."""
    last, quiet = -1.0, 0
    while quiet < 3:
        time.sleep(0.05)
        now = _total(_scrape(base), "isle_router_kv_event_batches")
        quiet = quiet + 1 if now == last else 0
        last = now


def _chat(url: str, turns: tuple[int, ...]) -> None:
    messages = [{"role": "system", "content": SYSTEM}]
    for k, user in enumerate(turns):
        messages.append({"role": "user", "content": USERS[user]})
        if k < len(turns) - 1:
            messages.append({"role": "assistant", "content": "Noted; the plumber comes on Monday."})
    body = {"model": MODEL, "max_tokens": 2, "messages": messages}
    req = urllib.request.Request(url + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json", "authorization": f"Bearer {DEV_KEY}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        resp.read()


@pytest.mark.parametrize("kind", ["sim", "vllm"])
def test_the_routers_expected_hits_are_the_engines(tmp_path: Path, kind: str) -> None:
    """Deliver 3's check on simulated engines: over a scripted shared-prefix sequence, the tokens the
    router expects each request to read from its replica's cache (`isle_router_prefix_hit_tokens`,
    counted as vLLM counts) and the tokens it keyed (`isle_router_prefix_query_tokens`) are the
    engines' own `vllm:prefix_cache_hits` and `queries`, per request and in total. `kind` vllm:
    the replicas are declared vLLM, so the router keys each prompt from their /tokenize (the
    simulated engine's serves its own tokens, as vLLM's does)."""
    sub_port, r0, r1 = free_ports(3)
    with _engine("e0", sub_port, r0) as e0, _engine("e1", sub_port, r1) as e1:
        config = {"port": 0, "require_keys": False,
                  "kv_events": {"endpoint": f"tcp://127.0.0.1:{sub_port}", "block_size": 16},
                  "default_profile": {"scorers": {"kv-cache-scorer": 1.0, "queue-depth-scorer": 0.1}},
                  "replicas": [{"replica_id": name, "url": e.base, "model": MODEL, "engine": kind,
                                "kv_events_replay": f"tcp://127.0.0.1:{port}"}
                               for name, e, port in (("e0", e0, r0), ("e1", e1, r1))]}
        with running_router(config, tmp_path) as (_, url):
            base = url.removesuffix("/v1")
            rows = []
            for turns in SCRIPT:
                _settled(base)
                before = (_scrape(base), _scrape(e0.base) + _scrape(e1.base))
                _chat(url, turns)
                after = (_scrape(base), _scrape(e0.base) + _scrape(e1.base))
                rows.append([_total(after[i], name) - _total(before[i], name) for i, name in (
                    (0, "isle_router_prefix_hit_tokens"), (1, "vllm:prefix_cache_hits"),
                    (0, "isle_router_prefix_query_tokens"), (1, "vllm:prefix_cache_queries"))])
            text = _scrape(base)
    expected, hits, keyed, queries = (sum(r[i] for r in rows) for i in range(4))
    print(json.dumps({"kind": kind, "rows": rows, "expected": expected, "hits": hits, "keyed": keyed,
                      "queries": queries}))  # the figures, with -s
    assert hits > 0.6 * queries  # the sequence is mostly shared
    assert abs(expected - hits) <= 0.1 * hits and abs(keyed - queries) <= 0.1 * queries, rows
    assert all(r[0] == r[1] and r[2] == r[3] for r in rows), rows  # one at a time: exactly, each request
    if kind == "vllm":
        assert 'isle_router_kv_tokenize_requests_total{outcome="fetched"} 5.0' in text  # each prompt once
        assert 'isle_router_kv_tokenize_requests_total{outcome="cached"} 3.0' in text  # the repeats
    else:
        assert "isle_router_kv_tokenize_requests_total{" not in text


@pytest.mark.parametrize("bad, message", [
    ({"kv_events": {"endpoint": "tcp://127.0.0.1:5557"}, "workers": 2}, "one router worker"),
    ({"kv_events": {"endpoint": "tcp://10.0.0.1:5557"}}, "kv_events.endpoint"),
    ({"replicas": [{"replica_id": "e0", "url": "http://127.0.0.1:8100", "model": MODEL,
                    "kv_events_replay": "tcp://10.0.0.2:5558"}]}, "kv_events_replay"),
])
def test_kv_events_config_is_checked(bad: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        RouterConfig.model_validate({"require_keys": False, **bad})


def test_the_scorer_scores_the_held_share_and_falls_back_to_the_prompt_hash_without_an_index() -> None:
    from pools.model import DEFAULT_SLO_CLASSES
    from pools.routing import ReplicaEndpoint
    from router.plugins.model import Candidate, RouteRequest
    from router.plugins.scorers import KvCacheScorer
    from router.state import ReplicaState

    scorer = KvCacheScorer(no_index=0.5)
    endpoint = ReplicaEndpoint(replica_id="e1", url="http://127.0.0.1:1", model=MODEL, pool="p", role="mixed")
    cand = Candidate(endpoint, ReplicaState(endpoint).candidate(0.0).load)
    slo = DEFAULT_SLO_CLASSES[0]
    assert scorer.score(RouteRequest(MODEL, slo, 100), cand) == 0.5
    assert scorer.score(RouteRequest(MODEL, slo, 1000, cacheable_tokens=960, cached={"e1": 720}), cand) == 0.75
    assert scorer.score(RouteRequest(MODEL, slo, 1000, cacheable_tokens=960, cached={"e0": 960}), cand) == 0.0
    from router.plugins.scorers import PrefixAffinityScorer  # no index: the prompt-hash affinity, the same prefix alike
    hashed = RouteRequest(MODEL, slo, 1000, prefix_hash=12345)
    assert scorer.score(hashed, cand) == PrefixAffinityScorer(0.5).score(hashed, cand) != 0.5


def test_without_kv_events_the_scorer_falls_back_and_says_so(tmp_path: Path) -> None:
    with running_engine("--model", MODEL, "--gpu", "h100-sxm", "--time-scale", "0.01") as e0:
        config = {"port": 0, "require_keys": False,
                  "default_profile": {"scorers": {"kv-cache-scorer": 1.0, "queue-depth-scorer": 1.0}},
                  "replicas": [{"replica_id": "e0", "url": e0.base, "model": MODEL}]}
        with running_router(config, tmp_path) as (_, url):
            for k in range(3):
                _post(url, DOC.format(n=k) * 10, DEV_KEY)
            text = _scrape(url.removesuffix("/v1"))
    falls = [x for x in text.splitlines() if x.startswith("isle_router_prefix_fallbacks_total{")]
    assert len(falls) == 1 and 'reason="no_index"' in falls[0] and falls[0].endswith(" 3.0")
