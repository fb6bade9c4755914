"""The simulated engine answers as vLLM 0.32's OpenAI server does: its request checks and error
shapes, max_tokens defaults, /tokenize and /detokenize, 404/405, and /metrics. Each case cites
the vLLM source it follows (paths inside the vllm package of vllm==0.32.0)."""

from __future__ import annotations

import http.client
import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.simengine.conftest import ENGINE_FLAGS, MODEL, client, post
from tests.support.engines import EngineProcess, running_engine
from wire.text import VOCAB

pytestmark = pytest.mark.integration
HI: Any = [{"role": "user", "content": "hi"}]
TOOLS: Any = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.fixture(scope="module")
def small() -> Iterator[EngineProcess]:
    """A KV cache of 512 tokens: max_model_len 512 (the context cut to the cache)."""
    with running_engine(*ENGINE_FLAGS, "--kv-capacity-tokens", "512") as e:
        yield e


def metrics(e: EngineProcess) -> dict[str, float]:
    with urllib.request.urlopen(f"{e.base}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def series(name: str, **labels: str) -> str:
    got = {"engine": "0", "model_name": MODEL, **labels}
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(got.items())) + "}"


# (route, extra body fields, status, error type, param, where vLLM decides it)
BAD_REQUESTS: list[tuple[str, dict[str, Any], int, str, str | None, str]] = [
    ("chat", {"user": {}}, 400, "Bad Request", "body.user", "ChatCompletionRequest.user: str | None (pydantic)"),
    ("chat", {"stop": 5}, 400, "Bad Request", "body.stop", "StopParam = str | list[str] | None"),
    ("chat", {"stop": ["a", "b", "c", "d", "e"]}, 400, "Bad Request", "body.stop",
     "StopParam: list max_length=VLLM_MAX_STOP_STRINGS (4)"),
    ("chat", {"stop": [""]}, 400, "BadRequestError", None, "SamplingParams._verify_args: stop cannot contain ''"),
    ("chat", {"presence_penalty": 9}, 400, "BadRequestError", None, "SamplingParams._verify_args: [-2, 2]"),
    ("chat", {"frequency_penalty": -3}, 400, "BadRequestError", None, "SamplingParams._verify_args: [-2, 2]"),
    ("chat", {"temperature": 3}, 400, "BadRequestError", "temperature", "SamplingParams._verify_args: [0, 2]"),
    ("chat", {"top_p": 0}, 400, "BadRequestError", "top_p", "SamplingParams._verify_args: (0, 1]"),
    ("chat", {"seed": "abc"}, 400, "Bad Request", "body.seed", "seed: int | None (pydantic)"),
    ("chat", {"ignore_eos": None}, 400, "Bad Request", "body.ignore_eos", "ignore_eos: bool = False"),
    ("chat", {"stop_token_ids": ["a"]}, 400, "Bad Request", "body.stop_token_ids.0", "stop_token_ids: list[int]"),
    ("chat", {"tools": "x"}, 400, "Bad Request", "body.tools", "tools: list[ChatCompletionToolsParam] | None"),
    ("chat", {"tools": []}, 400, "BadRequestError", "tools", "ChatCompletionRequest.check_tool_usage"),
    ("chat", {"tool_choice": "required"}, 400, "BadRequestError", "tool_choice", "check_tool_usage: needs tools"),
    ("chat", {"tools": TOOLS, "tool_choice": "bogus"}, 400, "BadRequestError", "tool_choice",
     "check_tool_usage: only named, none, auto, required"),
    ("chat", {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, 400,
     "BadRequestError", "tool_choice", "check_tool_usage: the named tool must be among tools"),
    ("chat", {"tools": TOOLS}, 400, "BadRequestError", None,
     "tools without tool_choice mean auto (check_tool_usage); online_renderer.render_chat: auto needs "
     "--enable-auto-tool-choice and --tool-call-parser"),
    ("chat", {"tools": TOOLS, "tool_choice": "required"}, 400, "BadRequestError", None,
     "online_renderer.render_chat: required needs --tool-call-parser"),
    ("chat", {"top_logprobs": 3}, 400, "BadRequestError", "top_logprobs", "ChatCompletionRequest.check_logprobs"),
    ("chat", {"logprobs": True, "top_logprobs": -2}, 400, "BadRequestError", "top_logprobs", "check_logprobs"),
    ("chat", {"logprobs": True, "top_logprobs": 21}, 400, "BadRequestError", "logprobs",
     "SamplingParams._validate_logprobs: ModelConfig.max_logprobs = 20"),
    ("chat", {"stream_options": {"include_usage": True}}, 400, "BadRequestError", "stream_options",
     "validate_stream_options: only with stream=True"),
    ("chat", {"response_format": {"type": "json_schema"}}, 400, "BadRequestError", "response_format",
     "validate_response_format: json_schema needs 'json_schema'"),
    ("chat", {"n": 0}, 400, "BadRequestError", None, "sampling_params._verify_num_sequences"),
    ("chat", {"n": 2, "temperature": 0}, 400, "BadRequestError", None, "SamplingParams._verify_greedy_sampling"),
    ("chat", {"max_tokens": 2, "min_tokens": 5}, 400, "BadRequestError", None, "_verify_args: min <= max_tokens"),
    ("chat", {"max_completion_tokens": 10**6}, 400, "BadRequestError", "max_completion_tokens",
     "TokenizeParams.__post_init__ (renderers/params.py): no more than max_model_len"),
    ("chat", {"model": "gpt-9"}, 404, "NotFoundError", "model", "OpenAIServing._check_model"),
    ("completion", {"max_tokens": 0}, 400, "BadRequestError", "max_tokens", "_verify_args: at least 1"),
    ("completion", {"logprobs": 21}, 400, "BadRequestError", "logprobs", "_validate_logprobs: max_logprobs 20"),
    ("completion", {"logprobs": "x"}, 400, "BadRequestError", "logprobs", "CompletionRequest.check_logprobs"),
    ("completion", {"n": None}, 400, "Bad Request", "body.n", "CompletionRequest.n: int = 1 (not nullable)"),
    ("completion", {"prompt": ""}, 400, "BadRequestError", "prompt", "validate_prompt_and_prompt_embeds"),
]


@pytest.mark.parametrize(("route", "extra", "status", "kind", "param", "why"), BAD_REQUESTS,
                         ids=[f"{r}-{next(iter(x))}-{k}" for k, (r, x, *_rest) in enumerate(BAD_REQUESTS)])
def test_bad_requests_get_vllms_status_and_shape(engine: EngineProcess, route: str, extra: dict[str, Any],
                                                 status: int, kind: str, param: str | None, why: str) -> None:
    """Model validators and SamplingParams answer "BadRequestError" with their parameter; field
    types answer pydantic's "Bad Request" with the field's location (vllm/entrypoints/serve/
    exception_handling/error_response.py `create_error_response`, handlers/validation.py
    `validation_exception_handler`)."""
    c = client(engine)
    base: dict[str, Any] = {"messages": HI} if route == "chat" else {"prompt": "x", "max_tokens": 2}
    body = {**base, **extra}
    model = body.pop("model", MODEL)
    with pytest.raises(openai.APIStatusError) as err:
        if route == "chat":
            c.chat.completions.create(model=model, messages=body.pop("messages"), extra_body=body)
        else:
            c.completions.create(model=model, prompt=body.pop("prompt"), extra_body=body)
    e = err.value
    assert isinstance(e.body, dict) and set(e.body) == {"message", "type", "param", "code"}
    assert (e.status_code, e.type, e.param, e.body["code"]) == (status, kind, param, status), (why, e.body)


def test_what_vllm_accepts(engine: EngineProcess) -> None:
    """Custom roles (renderers/chat_utils.py CustomChatCompletionMessageParam: "Enables custom
    roles"), unknown fields (OpenAIBaseModel extra="allow"), pydantic's lax ints ("5"), and no
    model at all (`_is_model_supported`: none means the served model)."""
    c = client(engine)
    bogus: Any = [{"role": "bogus", "content": "x"}]
    got = c.chat.completions.create(model=MODEL, messages=bogus, max_tokens=2,
                                    extra_body={"not_a_field": 1})
    assert got.usage is not None and got.usage.completion_tokens == 2
    status, body = post(f"{engine.base}/v1/completions", {"prompt": "x", "max_tokens": "5"})
    assert status == 200 and body["usage"]["completion_tokens"] == 5 and body["model"] == MODEL


def test_json_routes_want_json(engine: EngineProcess) -> None:
    """serve/utils/api_utils.py validate_json_request: only application/json (400 "Bad Request")."""
    status, body = post(f"{engine.base}/v1/completions", {"model": MODEL, "prompt": "x"}, "text/plain")
    assert status == 400 and body["error"]["type"] == "Bad Request"
    assert "Only 'application/json' is allowed" in body["error"]["message"]


def test_max_tokens_defaults(engine: EngineProcess, small: EngineProcess) -> None:
    """Chat: no max_tokens means up to the context (ChatCompletionRequest.max_tokens = None,
    api_utils.get_max_tokens: max_model_len - prompt); completions: 16 (CompletionRequest.max_tokens
    = 16). Asking for more than the context left is cut to it, not refused."""
    c = client(small)
    chat = c.chat.completions.create(model=MODEL, messages=HI, extra_body={"ignore_eos": True})
    assert chat.usage is not None and chat.choices[0].finish_reason == "length"
    assert chat.usage.prompt_tokens + chat.usage.completion_tokens == 512
    over = c.completions.create(model=MODEL, prompt="x" * 400, max_tokens=500, extra_body={"ignore_eos": True})
    assert over.usage is not None and over.usage.completion_tokens == 512 - 100
    comp = client(engine).completions.create(model=MODEL, prompt="x")
    assert comp.usage is not None and comp.usage.completion_tokens == 16 and comp.choices[0].finish_reason == "length"
    answer = client(engine).chat.completions.create(model=MODEL, messages=HI, seed=1)  # the model's own end
    assert answer.choices[0].finish_reason == "stop" and answer.usage is not None
    assert 256 < answer.usage.completion_tokens <= 1025
    card = next(iter(c.models.list()))
    assert card.model_extra is not None and card.model_extra["max_model_len"] == 512


def test_tokenize_and_detokenize(engine: EngineProcess) -> None:
    """serve/tokenize/protocol.py: TokenizeCompletionRequest / TokenizeChatRequest -> {count,
    max_model_len, tokens, token_strs}; DetokenizeRequest -> {prompt}. The count is what a request
    with the same prompt is charged."""
    c = client(engine)
    text = "The island is the unit of placement, é included."
    status, tok = post(f"{engine.base}/tokenize", {"model": MODEL, "prompt": text, "return_token_strs": True})
    used = c.completions.create(model=MODEL, prompt=text, max_tokens=1).usage
    assert status == 200 and used is not None and tok["count"] == len(tok["tokens"]) == used.prompt_tokens
    assert tok["max_model_len"] == 131072 and "".join(tok["token_strs"]).startswith("The island")
    status, back = post(f"{engine.base}/detokenize", {"model": MODEL, "tokens": tok["tokens"]})
    assert status == 200 and back == {"prompt": text}
    messages: Any = [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]
    status, tok = post(f"{engine.base}/tokenize", {"model": MODEL, "messages": messages})
    used = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=1).usage
    assert status == 200 and used is not None and tok["count"] == used.prompt_tokens
    words = [VOCAB.index("island"), VOCAB.index("cache")]  # generated words: their VOCAB index
    assert post(f"{engine.base}/detokenize", {"tokens": words}) == (200, {"prompt": " island cache"})
    status, body = post(f"{engine.base}/detokenize", {"tokens": [2**40]})
    assert status == 400 and "out of vocabulary" in body["error"]["message"]
    assert post(f"{engine.base}/tokenize", {"model": "gpt-9", "prompt": "x"})[0] == 404


def _raw(e: EngineProcess, method: str, path: str) -> tuple[int, dict[str, str], dict[str, Any]]:
    host, port = e.base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, json.loads(resp.read() or b"{}")
    finally:
        conn.close()


def test_wrong_method_is_405_with_allow(engine: EngineProcess) -> None:
    """Starlette answers a known path with the wrong method 405 (vLLM's http_exception_handler:
    type = the status phrase); an unknown path 404 "Not Found"."""
    with client(engine) as c, pytest.raises(openai.APIStatusError) as err:
        c.get("/chat/completions", cast_to=object)
    assert err.value.status_code == 405 and err.value.type == "Method Not Allowed"
    assert err.value.response.headers["allow"] == "POST"
    status, headers, body = _raw(engine, "TRACE", "/v1/models")
    assert status == 405 and headers["allow"] == "GET, HEAD" and body["error"]["code"] == 405
    status, _, body = _raw(engine, "GET", "/v1/nothing")
    assert status == 404 and body["error"] == {"message": "Not Found", "type": "Not Found", "param": None,
                                               "code": 404}


def test_metrics_are_vllm_032s(engine: EngineProcess) -> None:
    """v1/metrics/loggers.py PrometheusStatLogger: labels model_name and engine, its bucket
    boundaries (v1/metrics/buckets.py), no gpu_cache_usage_perc or time_per_output_token_seconds;
    one ITL observation per token gap and TTFT / TPOT / E2E per request, streamed or not;
    finished_reason the engine's reason."""
    before = metrics(engine)
    c = client(engine)
    list(c.completions.create(model=MODEL, prompt="m", max_tokens=64, stream=True))
    c.completions.create(model=MODEL, prompt="m", max_tokens=64)
    c.completions.create(model=MODEL, prompt="m", max_tokens=64, seed=5, stop=[" " + VOCAB[0]],
                         extra_body={"ignore_eos": True})
    after = metrics(engine)
    with urllib.request.urlopen(f"{engine.base}/metrics", timeout=10) as resp:
        text = resp.read().decode()

    def delta(name: str, **labels: str) -> float:
        return after[series(name, **labels)] - before.get(series(name, **labels), 0.0)

    assert delta("vllm:inter_token_latency_seconds_count") >= 126  # 63 + 63, and the stopped one's gaps
    for name in ("vllm:time_to_first_token_seconds_count", "vllm:e2e_request_latency_seconds_count",
                 "vllm:request_time_per_output_token_seconds_count", "vllm:request_queue_time_seconds_count",
                 "vllm:request_prefill_time_seconds_count", "vllm:request_decode_time_seconds_count",
                 "vllm:request_generation_tokens_count", "vllm:request_prompt_tokens_count"):
        assert delta(name) == 3, name
    assert delta("vllm:request_success_total", finished_reason="length") == 2
    assert delta("vllm:request_success_total", finished_reason="stop") == 1
    assert series("vllm:request_success_total", finished_reason="abort") in after
    assert 'vllm:time_to_first_token_seconds_bucket{engine="0",le="2560.0",model_name="llama-3.1-8b"}' in text
    assert 'vllm:inter_token_latency_seconds_bucket{engine="0",le="0.025",model_name="llama-3.1-8b"}' in text
    assert 'vllm:e2e_request_latency_seconds_bucket{engine="0",le="7680.0",model_name="llama-3.1-8b"}' in text
    assert 'vllm:request_prompt_tokens_bucket{engine="0",le="100000.0",model_name="llama-3.1-8b"}' in text
    assert not re.search(r"^vllm:(gpu_cache_usage_perc|time_per_output_token_seconds)", text, re.M)
