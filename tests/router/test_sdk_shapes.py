"""The shapes the common SDKs send, through the router to simulated engines started as
configs/local.yaml starts them (vLLM's tool flags: `--tool-call-parser hermes
--enable-auto-tool-choice`), on loopback: the openai SDK's tools and Responses API, LangChain's
`bind_tools`, `with_structured_output` and `use_responses_api`, litellm's tools; and the
refusals a user meets, in vLLM's words and one error type (issue 30)."""

from __future__ import annotations

import gc
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from pydantic import BaseModel

from router.config import DEV_ADMIN_KEY, DEV_KEY, sha256
from tests.support.clients import openai_client
from tests.support.engines import EngineProcess, running_router, start_engine, stop_engine

pytestmark = pytest.mark.integration
MODEL = "llama-3.1-8b"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TOOL_FLAGS = ("--tool-call-parser", "hermes", "--enable-auto-tool-choice")


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A router over two simulated engines with configs/local.yaml's tool flags: its /v1 URL."""
    engines: dict[str, EngineProcess] = {}
    try:
        for name in ("m1", "m2"):
            engines[name] = start_engine("--model", MODEL, "--gpu", "h100-sxm", "--time-scale", "0.005",
                                         "--engine-id", name, *TOOL_FLAGS)
        config = {"port": 0, "require_keys": True, "keys": [{"tenant": "dev", "key_sha256": sha256(DEV_KEY)}],
                  "admin_keys": [{"tenant": "ops", "key_sha256": sha256(DEV_ADMIN_KEY)}],
                  "replicas": [{"replica_id": name, "url": e.base, "model": MODEL, "pool": "mixed", "role": "mixed",
                                "node": node, "gpu_model": "h100-sxm", "catalog_model": MODEL}
                               for (name, e), node in zip(engines.items(), ("h100-0", "h100-1"), strict=True)]}
        with running_router(config, tmp_path_factory.mktemp("sdk")) as (_, found):
            yield found
    finally:
        for e in engines.values():
            stop_engine(e)


def _client(url: str) -> openai.OpenAI:
    return openai_client(url, DEV_KEY)


def test_openai_tools_auto_required_and_named(url: str) -> None:
    c: Any = _client(url)
    ask = [{"role": "user", "content": "what is the weather in Lisbon?"}]
    for choice in ("auto", "required", {"type": "function", "function": {"name": "get_weather"}}):
        got = c.chat.completions.create(model=MODEL, messages=ask, tools=[WEATHER], tool_choice=choice,
                                        max_tokens=200)
        calls = got.choices[0].message.tool_calls
        assert calls and calls[0].function.name == "get_weather", choice
        assert isinstance(json.loads(calls[0].function.arguments), dict)


def _counted(url: str, family: str) -> float:
    """The router's observations of a histogram (`<family>_count`, every label set summed)."""
    with urllib.request.urlopen(url.removesuffix("/v1") + "/metrics", timeout=10) as resp:
        lines = resp.read().decode().splitlines()
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in lines if ln.startswith(f"{family}_count"))


def test_responses_api_whole_and_streamed(url: str) -> None:
    c = _client(url)
    whole = c.responses.create(model=MODEL, input="name three islands", instructions="answer briefly",
                               max_output_tokens=12)
    assert whole.object == "response" and whole.status in ("completed", "incomplete") and whole.output_text
    first_id = whole.output[0].id
    assert whole.id.startswith("resp_") and first_id is not None and first_id.startswith("msg_")
    assert whole.usage is not None and whole.usage.output_tokens <= 12 < whole.usage.total_tokens
    listed = c.responses.create(model=MODEL, input=[{"role": "user", "content": "hello"},
                                                    {"role": "assistant", "content": "hi"},
                                                    {"role": "user", "content": [{"type": "input_text",
                                                                                  "text": "and now?"}]}],
                                max_output_tokens=6)
    assert listed.usage is not None and listed.usage.output_tokens == 6 and listed.status == "incomplete"
    ttft, itl = _counted(url, "isle_router_ttft_seconds"), _counted(url, "isle_router_itl_seconds")
    events: list[Any] = list(c.responses.create(model=MODEL, input="stream me", max_output_tokens=8, stream=True))
    # the router times it as a chat stream: a first token, then one gap per further token
    assert (_counted(url, "isle_router_ttft_seconds"), _counted(url, "isle_router_itl_seconds")) == (ttft + 1,
                                                                                                   itl + 7)
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    done = events[-1].response
    assert len(deltas) == 8 and "".join(deltas) == done.output_text and done.usage.output_tokens == 8
    assert [e.sequence_number for e in events] == list(range(len(events)))


RESPONSES_WEATHER = {"type": "function", "name": "get_weather", "description": "the weather in a city",
                     "parameters": WEATHER["function"]["parameters"]}  # type: ignore[index]


def test_responses_api_function_calls_whole_and_streamed(url: str) -> None:
    c: Any = _client(url)
    for choice in ("auto", "required", {"type": "function", "name": "get_weather"}):
        got = c.responses.create(model=MODEL, input="weather in Lisbon?", tools=[RESPONSES_WEATHER],
                                 tool_choice=choice, max_output_tokens=200)
        calls = [o for o in got.output if o.type == "function_call"]
        assert len(calls) == 1 and calls[0].name == "get_weather", choice
        assert isinstance(json.loads(calls[0].arguments), dict) and calls[0].call_id.startswith("call_")
    itl = _counted(url, "isle_router_itl_seconds")
    events = list(c.responses.create(model=MODEL, input="weather?", tools=[RESPONSES_WEATHER],
                                     tool_choice="required", max_output_tokens=200, stream=True))
    kinds = [e.type for e in events]
    assert kinds[2] == "response.output_item.added" and events[2].item.type == "function_call"
    assert kinds[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = events[-1].response.output[-1]
    assert deltas == events[-3].arguments == done.arguments and json.loads(deltas)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert _counted(url, "isle_router_itl_seconds") == itl + kinds.count("response.function_call_arguments.delta") - 1


class Weather(BaseModel):
    city: str
    degrees: int


def test_langchain_bind_tools_structured_output_and_responses(url: str) -> None:
    from langchain_openai import ChatOpenAI

    key: Any = DEV_KEY
    llm = ChatOpenAI(model=MODEL, base_url=url, api_key=key, max_retries=0, timeout=60, max_completion_tokens=200)
    called = llm.bind_tools([WEATHER]).invoke("what is the weather in Lisbon?")
    assert called.tool_calls and called.tool_calls[0]["name"] == "get_weather"
    for method in ("json_schema", "function_calling"):
        got = llm.with_structured_output(Weather, method=method).invoke("the weather in Lisbon")
        assert isinstance(got, Weather), method
    responses = ChatOpenAI(model=MODEL, base_url=url, api_key=key, max_retries=0, use_responses_api=True,
                           max_completion_tokens=10)
    assert responses.invoke("hello").text
    agent = ChatOpenAI(model=MODEL, base_url=url, api_key=key, max_retries=0, use_responses_api=True,
                       max_completion_tokens=200).bind_tools([WEATHER])
    assert agent.invoke("what is the weather in Lisbon?").tool_calls[0]["name"] == "get_weather"


# litellm drops HTTP clients it made with their keep-alive connections to the router still open: the
# collector then reports them as unclosed sockets, in whichever test it happens to run. They are
# litellm's own; this test collects them itself, under this filter.
@pytest.mark.filterwarnings("ignore::ResourceWarning", "ignore::pytest.PytestUnraisableExceptionWarning")
def test_litellm_tool_calls_and_responses(url: str) -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch from the network
    import litellm

    got: Any = litellm.completion(model=f"openai/{MODEL}", api_base=url, api_key=DEV_KEY, tools=[WEATHER],
                                  messages=[{"role": "user", "content": "weather in Lisbon?"}], max_tokens=200)
    calls = got.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather"
    answer: Any = litellm.responses(model=f"openai/{MODEL}", api_base=url, api_key=DEV_KEY, input="hello",
                                    max_output_tokens=20)  # litellm raises less than 16 to 16, OpenAI's least
    assert answer.status == "incomplete" and answer.usage.output_tokens == 20 and answer.output[0].content[0].text
    del got, calls, answer
    gc.collect()


def _post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None,
          path: str = "/chat/completions") -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers={
        "content-type": "application/json", "authorization": f"Bearer {DEV_KEY}", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())["error"]


def test_an_image_on_a_text_only_model_is_refused_as_vllm_refuses_it(url: str) -> None:
    parts: Any = [{"type": "text", "text": "what is in this picture?"},
             {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]
    with pytest.raises(openai.BadRequestError) as err:
        _client(url).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": parts}])
    assert err.value.body == {"message": f"{MODEL} is not a multimodal model", "type": "BadRequestError",
                              "param": None, "code": 400}


def test_the_routers_own_refusals_say_what_is_wrong_with_one_type(url: str) -> None:
    hi = [{"role": "user", "content": "hi"}]
    refusals = {
        "no messages": _post(url, {"model": MODEL, "prompt": "hi"}),
        "no model": _post(url, {"messages": hi}),
        "empty x-slo-class": _post(url, {"model": MODEL, "messages": hi}, {"x-slo-class": ""}),
        "unknown x-slo-class": _post(url, {"model": MODEL, "messages": hi}, {"x-slo-class": "gold"}),
        "over the token limit": _post(url, {"model": MODEL, "messages": hi, "max_tokens": 10**6}),
        "no input": _post(url, {"model": MODEL}, path="/responses"),
    }
    for what, (status, error) in refusals.items():
        assert status == 400 and error["type"] == "BadRequestError", (what, error)
    assert refusals["no messages"][1]["param"] == "messages" and "'messages' is required" in \
        refusals["no messages"][1]["message"]
    assert refusals["empty x-slo-class"][1]["param"] == "x-slo-class"
    assert refusals["no input"][1]["param"] == "input"
