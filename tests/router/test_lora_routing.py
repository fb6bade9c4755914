"""LoRA adapters routed like models (config `lora`, `router.lora`), end to end on loopback: two
simulated engines started as vLLM is (`--enable-lora --max-loras 1`, runtime updating allowed),
the router as a user starts it, and every request through the official openai client.

Issue 33's Done-when: two adapters on two replicas; requests for each go to the replica holding
it (the router's `x-isle-replica` and the engines' own request counters say so); a third adapter
loads on demand and the coldest is unloaded (the engines' own /v1/models say so). Also: one load
for many concurrent first requests of an adapter, and the admin routes."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import openai
import pytest

from router.config import DEV_ADMIN_KEY, DEV_KEY, sha256
from tests.conftest import ROOT
from tests.support.clients import openai_client
from tests.support.engines import EngineProcess, running_engine, running_router

pytestmark = pytest.mark.integration

MODEL = "llama-3.1-8b"
ADAPTERS = [{"name": n, "path": f"/adapters/{n}", "base_model": MODEL} for n in ("sql", "chat", "math")]


@contextmanager
def _cluster(tmp_path: Path, modules: dict[str, list[str]], max_loras: int = 1,
             adapters: list[dict[str, str]] | None = None) -> Iterator[tuple[str, dict[str, EngineProcess]]]:
    """Engines e0, e1 (with these --lora-modules each) behind a router; (router /v1 URL, engines)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "1")
    with ExitStack() as stack:
        stack.callback(mp.undo)
        engines = {}
        for name in ("e0", "e1"):
            flags = ["--model", MODEL, "--gpu", "h100-sxm", "--time-scale", "0.02", "--engine-id", name,
                     "--enable-lora", "--max-loras", str(max_loras)]
            if modules.get(name):
                flags += ["--lora-modules", *modules[name]]
            engines[name] = stack.enter_context(running_engine(*flags))
        admins = [{"tenant": "ops", "key_sha256": sha256(DEV_ADMIN_KEY)}]
        config = {"port": 0, "require_keys": False, "admin_keys": admins,
                  "lora": {"max_loras": max_loras, "adapters": ADAPTERS if adapters is None else adapters,
                           "refresh_s": 0.2},
                  "replicas": [{"replica_id": n, "url": e.base, "model": MODEL} for n, e in engines.items()]}
        _, url = stack.enter_context(running_router(config, tmp_path))
        yield url, engines


def _client(url: str) -> openai.OpenAI:
    return openai_client(url, DEV_KEY)


def _ask(client: openai.OpenAI, model: str) -> tuple[str, str]:
    """(the replica that served it, the model the answer names)."""
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": f"a question for {model}"}], max_tokens=2)
    return raw.headers.get("x-isle-replica", ""), raw.parse().model


def _get(url: str, key: str | None = None) -> Any:
    req = urllib.request.Request(url, headers={"authorization": f"Bearer {key}"} if key else {})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def _admin(base: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers={
        "content-type": "application/json", "authorization": f"Bearer {DEV_ADMIN_KEY}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        with err:
            return err.code, json.loads(err.read())


def _engine_adapters(engine: EngineProcess) -> set[str]:
    return {m["id"] for m in _get(engine.url + "/models")["data"] if m.get("parent")}


def _served(engine: EngineProcess) -> float:
    """The engine's own count of finished requests (vllm:request_success_total)."""
    with urllib.request.urlopen(engine.base + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith("vllm:request_success_total{"))


def _router_counter(base: str, name: str, **labels: str) -> float:
    with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines()
               if x.startswith(name + "_total{") and all(w in x for w in want))


def _wait_for_holdings(base: str, expected: dict[str, list[str]]) -> None:
    """Until the router's view (GET /admin/lora) shows the engines' adapters (read every 0.2 s)."""
    seen: Any = None
    for _ in range(100):
        seen = _get(base + "/admin/lora", DEV_ADMIN_KEY)["replicas"]
        if {r: sorted(v) for r, v in seen.items()} == expected:
            return
        time.sleep(0.1)
    raise AssertionError(f"the router holds {seen}, not {expected}")


def test_adapters_go_to_their_replica_and_a_third_evicts_the_coldest(tmp_path: Path) -> None:
    with _cluster(tmp_path, {"e0": ["sql=/adapters/sql"], "e1": ["chat=/adapters/chat"]}) as (url, engines):
        base = url.removesuffix("/v1")
        e0, e1 = engines["e0"], engines["e1"]
        _wait_for_holdings(base, {"e0": ["sql"], "e1": ["chat"]})
        client = _client(url)
        try:
            cards = {m.id: m.model_dump() for m in client.models.list().data}
            assert {n: (c["parent"], c["root"]) for n, c in cards.items() if c.get("parent")} == {
                a["name"]: (MODEL, a["path"]) for a in ADAPTERS}  # base models and adapters, as vLLM lists them
            assert client.models.retrieve("math").model_dump()["parent"] == MODEL
            before = _served(e0), _served(e1)
            assert [_ask(client, "sql") for _ in range(4)] == [("e0", "sql")] * 4
            assert (_served(e0) - before[0], _served(e1) - before[1]) == (4, 0)  # the engines' own counters
            assert [_ask(client, "chat") for _ in range(4)] == [("e1", "chat")] * 4
            assert (_served(e0) - before[0], _served(e1) - before[1]) == (4, 4)

            # a third adapter: both replicas are full (max_loras 1); sql, used before chat, is the coldest
            assert _ask(client, "math") == ("e0", "math")
            assert _engine_adapters(e0) == {"math"} and _engine_adapters(e1) == {"chat"}
            assert _router_counter(base, "isle_router_lora_unloads", replica="e0", reason="evicted") == 1
            assert _router_counter(base, "isle_router_lora_loads", replica="e0", outcome="loaded") == 1
            assert [_ask(client, "math") for _ in range(2)] == [("e0", "math")] * 2  # held now: no second load

            # sql again: now chat is the coldest
            assert _ask(client, "sql") == ("e1", "sql")
            assert _engine_adapters(e0) == {"math"} and _engine_adapters(e1) == {"sql"}
            assert _router_counter(base, "isle_router_lora_loads", outcome="loaded") == 2

            with pytest.raises(openai.NotFoundError):
                _ask(client, "nosuch")
        finally:
            client.close()


def test_concurrent_first_requests_load_an_adapter_once(tmp_path: Path) -> None:
    with _cluster(tmp_path, {}, max_loras=2) as (url, engines):
        base = url.removesuffix("/v1")
        _wait_for_holdings(base, {"e0": [], "e1": []})
        client = _client(url)
        answers: list[tuple[str, str]] = []
        errors: list[BaseException] = []

        def one() -> None:
            try:
                answers.append(_ask(client, "sql"))
            except BaseException as err:
                errors.append(err)

        threads = [threading.Thread(target=one) for _ in range(8)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
        finally:
            client.close()
        assert not errors and len(answers) == 8
        holder = answers[0][0]
        assert answers == [(holder, "sql")] * 8
        assert _router_counter(base, "isle_router_lora_loads") == 1
        assert [n for n, e in engines.items() if "sql" in _engine_adapters(e)] == [holder]


def test_the_admin_routes_load_and_unload_at_run_time(tmp_path: Path) -> None:
    with _cluster(tmp_path, {}, max_loras=2, adapters=[]) as (url, engines):
        base = url.removesuffix("/v1")
        status, found = _admin(base, "/admin/lora/load", {"lora_name": "legal", "lora_path": "/adapters/legal",
                                                          "replica_id": "e1"})
        assert status == 200 and found["replica_ids"] == ["e1"], found
        assert _engine_adapters(engines["e1"]) == {"legal"} and _engine_adapters(engines["e0"]) == set()
        client = _client(url)
        try:
            assert "legal" in {m.id for m in client.models.list().data}
            assert _ask(client, "legal") == ("e1", "legal")
            status, found = _admin(base, "/admin/lora/unload", {"lora_name": "legal"})
            assert status == 200 and found["unloaded_from"] == ["e1"]
            assert _engine_adapters(engines["e1"]) == set()
            with pytest.raises(openai.NotFoundError):  # loaded at run time, unloaded everywhere: forgotten
                _ask(client, "legal")
        finally:
            client.close()
        status, _ = _admin(base, "/admin/lora/load", {"lora_name": "x"})
        assert status == 400
        user = {"authorization": f"Bearer {DEV_KEY}", "content-type": "application/json"}
        req = urllib.request.Request(base + "/admin/lora/load", data=b"{}", headers=user)
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=10)
        err.value.close()
        assert err.value.code == 403  # a user key does not open the admin routes


def test_a_zipf_lora_load_from_the_load_tester(tmp_path: Path) -> None:
    """`python -m loadtest run --lora-adapters`: every request names an adapter, all are served, each
    adapter loaded once (two replicas with two slots each hold all three)."""
    with _cluster(tmp_path, {}, max_loras=2) as (url, _):
        base = url.removesuffix("/v1")
        out = tmp_path / "results.jsonl"
        done = subprocess.run(
            [sys.executable, "-m", "loadtest", "run", "--target", base, "--workload",
             "synthetic:poisson,rate=40,prompt=32,output=4,requests=40", "--lora-adapters", "sql,chat,math",
             "--model", MODEL, "--format", "json", "--out", str(out)],
            cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        results = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(results) == 40 and {r["outcome"] for r in results} == {"ok"}
        held = _get(base + "/admin/lora", DEV_ADMIN_KEY)
        assert sorted(a["name"] for a in held["adapters"] if a["replicas"]) == ["chat", "math", "sql"]
        assert _router_counter(base, "isle_router_lora_loads", outcome="loaded") == 3
        assert _router_counter(base, "isle_router_lora_unloads") == 0
