"""Routing on what a replica can serve (issue 30): the RTX 4090 replica's context is 27,008 tokens,
the H100's 131,072 (configs/local.yaml's GPUs, the simulated engines' auto-fitted contexts). A
request is sent where its prompt and max_tokens fit; 400 only where no replica of the model can,
in vLLM's words; /v1/models and /openapi.json say the largest context. Driven with the official
openai client through the router on loopback, in front of real simulated engine processes."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from router.config import DEV_ADMIN_KEY, DEV_KEY, sha256
from tests.support.clients import openai_client
from tests.support.engines import EngineProcess, running_router, start_engine, stop_engine
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration
MODEL = "llama-3.1-8b"
SMALL, LARGE = 27008, 131072
"""The engines' max_model_len: llama-3.1-8b on an RTX 4090 (what its KV cache holds) and on an H100."""
REPLICAS = {"rtx": ("rtx-4090", "pcie-box", SMALL), "h100": ("h100-sxm", "h100-0", LARGE)}


def _config(engines: dict[str, EngineProcess], names: tuple[str, ...], **extra: Any) -> dict[str, Any]:
    return {"port": 0, "require_keys": True, "keys": [{"tenant": "dev", "key_sha256": sha256(DEV_KEY)}],
            "admin_keys": [{"tenant": "ops", "key_sha256": sha256(DEV_ADMIN_KEY)}], "scrape_interval_s": 0.2,
            "replicas": [{"replica_id": name, "url": engines[name].base, "model": MODEL, "pool": f"pool-{name}",
                          "role": "mixed", "node": REPLICAS[name][1], "gpu_model": REPLICAS[name][0],
                          "catalog_model": MODEL} for name in names], **extra}


def _knows_contexts(url: str, largest: int) -> None:
    """Until the router learnt its engines' contexts (it asks each engine's /v1/models)."""
    def said() -> bool:
        req = urllib.request.Request(f"{url}/models", headers={"authorization": f"Bearer {DEV_KEY}"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            return bool(json.loads(resp.read())["data"][0].get("max_model_len") == largest)
    wait_until(said, 30, f"the router's /v1/models says max_model_len {largest}")


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[str, EngineProcess]]:
    started: dict[str, EngineProcess] = {}
    try:
        for name, (gpu, _, _) in REPLICAS.items():
            started[name] = start_engine("--model", MODEL, "--gpu", gpu, "--time-scale", "0.005", "--engine-id", name)
        yield started
    finally:
        for e in started.values():
            stop_engine(e)


@pytest.fixture(scope="module")
def both(engines: dict[str, EngineProcess], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A router over both replicas: its /v1 URL."""
    with running_router(_config(engines, ("rtx", "h100")), tmp_path_factory.mktemp("both")) as (_, url):
        _knows_contexts(url, LARGE)
        yield url


@pytest.fixture(scope="module")
def small_only(engines: dict[str, EngineProcess], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A router over the RTX 4090 replica alone."""
    with running_router(_config(engines, ("rtx",)), tmp_path_factory.mktemp("small")) as (_, url):
        _knows_contexts(url, SMALL)
        yield url


def _client(url: str) -> openai.OpenAI:
    return openai_client(url, DEV_KEY)


def test_max_tokens_past_the_small_context_never_depends_on_the_replica(both: str) -> None:
    """`max_tokens=29951` was refused five times out of six: now every one goes where it fits."""
    c = _client(both)
    served = []
    for k in range(8):
        raw = c.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": f"tell me about islands {k}"}], max_tokens=29951)
        assert raw.parse().choices[0].message.content
        served.append(raw.headers["x-isle-replica"])
    assert set(served) == {"h100"}
    short = {c.completions.with_raw_response.create(model=MODEL, prompt=f"hi {k}", max_tokens=4)
             .headers["x-isle-replica"] for k in range(12)}
    assert "rtx" in short  # what fits both still goes to both (by load)


def test_the_models_list_and_the_document_say_the_largest_context(both: str, small_only: str) -> None:
    assert [(m.id, m.model_extra) for m in _client(both).models.list()] == [(MODEL, {"max_model_len": LARGE})]
    assert _client(both).models.retrieve(MODEL).model_extra == {"max_model_len": LARGE}

    def max_tokens_bound(url: str) -> int:
        with urllib.request.urlopen(url.removesuffix("/v1") + "/openapi.json", timeout=10) as resp:
            schemas = json.loads(resp.read())["components"]["schemas"]
        field = schemas["ChatCompletionRequest"]["properties"]["max_tokens"]
        return int(next(s["maximum"] for s in field["anyOf"] if "maximum" in s))

    assert max_tokens_bound(both) == 32768  # the router's max_tokens_limit: below the largest context
    assert max_tokens_bound(small_only) == SMALL


def test_what_no_replica_can_serve_is_refused_in_vllms_words(small_only: str, both: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        _client(small_only).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                                    max_tokens=29951)
    assert err.value.body == {
        "message": f"max_tokens=29951 cannot be greater than max_model_len={SMALL}. Please request fewer output "
                   "tokens. (parameter=max_tokens, value=29951)",
        "type": "BadRequestError", "param": "max_tokens", "code": 400}
    long_prompt = "island " * (LARGE // 7 * 4 + 4000)  # past 131,072 tokens at the documented 4 bytes a token
    with pytest.raises(openai.BadRequestError, match=f"maximum context length is {LARGE} tokens") as err:
        _client(both).completions.create(model=MODEL, prompt=long_prompt, max_tokens=1)
    assert err.value.body["param"] == "input_tokens"  # type: ignore[index]


def test_a_prompt_that_fits_only_the_large_context_goes_there(both: str) -> None:
    prompt = "island " * (SMALL // 7 * 4 + 2000)  # about 31,000 tokens
    raw = _client(both).completions.with_raw_response.create(model=MODEL, prompt=prompt, max_tokens=2)
    assert raw.headers["x-isle-replica"] == "h100" and raw.parse().usage.prompt_tokens > SMALL  # type: ignore[union-attr]


def _post(url: str, path: str, body: dict[str, Any], key: str | None) -> tuple[int, dict[str, Any]]:
    headers = {"content-type": "application/json", **({"authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(url.removesuffix("/v1") + path, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_tokenize_is_open_as_on_vllm_unless_configured(both: str, engines: dict[str, EngineProcess],
                                                       tmp_path: Path) -> None:
    """vLLM's --api-key guards only /v1, /v2 and /inference: `vllm bench serve` calls /tokenize
    without a key. The router does the same by default; `tokenize_auth: key` asks for one."""
    status, body = _post(both, "/tokenize", {"model": MODEL, "prompt": "an island of GPUs"}, None)
    assert status == 200 and body["count"] == len(body["tokens"]) > 0
    assert _post(both, "/detokenize", {"model": MODEL, "tokens": body["tokens"]}, None)[0] == 200
    assert _post(both, "/v1/completions", {"model": MODEL, "prompt": "x"}, None)[0] == 401
    with running_router(_config(engines, ("rtx",), tokenize_auth="key"), tmp_path) as (_, url):
        status, body = _post(url, "/tokenize", {"model": MODEL, "prompt": "x"}, None)
        assert status == 401 and body["error"]["type"] == "authentication_error"
        assert _post(url, "/tokenize", {"model": MODEL, "prompt": "x"}, DEV_KEY)[0] == 200
