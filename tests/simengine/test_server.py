"""The simulated engine as a real server on loopback, driven by the official openai client."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.support.clients import openai_client
from tests.support.engines import EngineProcess, running_engine

pytestmark = pytest.mark.integration
MODEL = "llama-3.1-8b"


@pytest.fixture(scope="module")
def engine() -> Iterator[EngineProcess]:
    """This module's own engine, TP 2 (in place of the session's, tests/simengine/conftest.py)."""
    with running_engine("--model", MODEL, "--gpu", "h100-sxm", "--tp", "2", "--time-scale", "0.05") as e:
        yield e


def client(e: EngineProcess) -> openai.OpenAI:
    return openai_client(e.url, "unused", timeout=30)


def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_chat_and_completions_with_the_openai_client(engine: EngineProcess) -> None:
    c = client(engine)
    chat = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=7)
    assert chat.choices[0].finish_reason == "length" and chat.usage is not None
    assert chat.usage.completion_tokens == 7 and len(chat.choices[0].message.content.split()) == 7  # type: ignore[union-attr]
    comp = c.completions.create(model=MODEL, prompt="The island is", max_tokens=4)
    assert comp.usage is not None and comp.usage.completion_tokens == 4 and comp.choices[0].text
    assert [m.id for m in c.models.list()] == [MODEL]


def test_streams_with_usage(engine: EngineProcess) -> None:
    c = client(engine)
    stream = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                       stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert len(text.split()) == 5 and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    comp = list(c.completions.create(model=MODEL, prompt="x", max_tokens=3, stream=True))
    assert "".join(ch.choices[0].text for ch in comp if ch.choices).count(" ") == 3


def test_same_seed_same_text(engine: EngineProcess) -> None:
    c = client(engine)
    a, b = (c.completions.create(model=MODEL, prompt="p", max_tokens=6, seed=42).choices[0].text for _ in range(2))
    other = c.completions.create(model=MODEL, prompt="p", max_tokens=6, seed=7).choices[0].text
    assert a == b and a != other


def test_errors_in_openai_shape(engine: EngineProcess) -> None:
    """vLLM's shapes: a check of its own is "BadRequestError" with its parameter; a field of the
    wrong type is pydantic's "Bad Request" with the field's location (vllm/entrypoints/serve/
    exception_handling/: error_response.py, handlers/validation.py). More in test_engine_vllm_compat."""
    c = client(engine)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        c.completions.create(model="gpt-9", prompt="x")
    with pytest.raises(openai.BadRequestError, match="max_tokens") as err:
        c.completions.create(model=MODEL, prompt="x", max_tokens=10**9)
    assert err.value.type == "BadRequestError" and err.value.param == "max_tokens"
    status, body = post(f"{engine.base}/v1/chat/completions", {"model": MODEL, "messages": "nope"})
    assert status == 400 and body["error"]["param"] == "body.messages" and body["error"]["type"] == "Bad Request"


def test_metrics_use_vllm_names(engine: EngineProcess) -> None:
    client(engine).completions.create(model=MODEL, prompt="metrics", max_tokens=3)
    text = urllib.request.urlopen(f"{engine.base}/metrics", timeout=10).read().decode()
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
                 "vllm:e2e_request_latency_seconds_count", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total"):
        assert name in text, name
    assert urllib.request.urlopen(f"{engine.base}/health", timeout=10).status == 200


def test_200_concurrent_streams_complete(engine: EngineProcess) -> None:
    async def one(c: openai.AsyncOpenAI, i: int) -> int:
        stream = await c.completions.create(model=MODEL, prompt=f"stream {i}", max_tokens=16, stream=True)
        return len([ch async for ch in stream if ch.choices and ch.choices[0].text])

    async def main() -> list[int]:
        c = openai.AsyncOpenAI(base_url=engine.url, api_key="unused", max_retries=0, timeout=60)
        try:
            return await asyncio.gather(*(one(c, i) for i in range(200)))
        finally:
            await c.close()

    assert asyncio.run(main()) == [16] * 200
