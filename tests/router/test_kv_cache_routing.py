"""The router's prefix-cache index from the engines' KV events (`router.kvindex`, config
`kv_events`, the `kv-cache-scorer`): two simulated engines publish their caches; a long prompt
warmed on one of them directly is routed back to it, the router's /metrics shows what it
indexed, and the engines' own hit counters agree with the routing."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from router.config import DEV_KEY, RouterConfig
from tests.support.engines import running_engine, running_router
from tests.support.ports import free_ports

pytestmark = pytest.mark.integration

MODEL = "llama-3.1-8b"
DOC = "Clause {n}: the tenant shall keep the premises in good repair and report any damage. "


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
    events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{sub_port}"}

    def engine(name: str, replay: int) -> Any:
        config = {**events, "replay_endpoint": f"tcp://127.0.0.1:{replay}", "topic": name}
        return running_engine("--model", MODEL, "--gpu", "h100-sxm", "--time-scale", "0.01", "--engine-id", name,
                              "--enable-prefix-caching", "--kv-events-config", json.dumps(config))

    with engine("e0", r0) as e0, engine("e1", r1) as e1:
        config = {"port": 0, "require_keys": False,
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


@pytest.mark.parametrize("bad, message", [
    ({"kv_events": {"endpoint": "tcp://127.0.0.1:5557"}, "workers": 2}, "one router worker"),
    ({"kv_events": {"endpoint": "tcp://10.0.0.1:5557"}}, "kv_events.endpoint"),
    ({"replicas": [{"replica_id": "e0", "url": "http://127.0.0.1:8100", "model": MODEL,
                    "kv_events_replay": "tcp://10.0.0.2:5558"}]}, "kv_events_replay"),
])
def test_kv_events_config_is_checked(bad: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        RouterConfig.model_validate({"require_keys": False, **bad})


def test_the_scorer_scores_the_held_share_and_is_neutral_without_an_index() -> None:
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
