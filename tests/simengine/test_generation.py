"""What the simulated engine generates honours the request as vLLM 0.32 does: seed, stop strings
and token ids, min_tokens, n choices and lists of prompts (each its own sequence in the batching
core), logprobs, response_format and tools by guided decoding. Through the official openai client
against real engines on loopback; each case cites the vLLM source it follows."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import openai
import pytest

from tests.simengine.conftest import ENGINE_FLAGS, MODEL, client, get, post
from tests.simengine.test_vllm_compat import HI, TOOLS
from tests.support.engines import EngineProcess, running_engine
from wire.text import VOCAB

pytestmark = pytest.mark.integration
SCHEMA: Any = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "score": {"type": "number"}, "ok": {"type": "boolean"}, "tags": {"type": "array", "items": {"type": "string"}},
    "tier": {"enum": ["gold", "silver"]}}, "required": ["name", "age", "tier"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tooled() -> Iterator[EngineProcess]:
    """vLLM started with --enable-auto-tool-choice --tool-call-parser hermes."""
    with running_engine(*ENGINE_FLAGS, "--tool-call-parser", "hermes", "--enable-auto-tool-choice") as e:
        yield e


def words(e: EngineProcess, seed: int, n: int) -> list[str]:
    """The first n words a seeded answer has (ignore_eos, no stop)."""
    got = client(e).completions.create(model=MODEL, prompt="p", max_tokens=n, seed=seed,
                                       extra_body={"ignore_eos": True})
    return got.choices[0].text.split()


def test_same_seed_same_output_and_n_choices_differ(engine: EngineProcess) -> None:
    """Same seed and request, same output; each of n choices its own seed (v1/engine/
    parallel_sampling.py: child seed = seed + index)."""
    c = client(engine)
    a, b = (c.chat.completions.create(model=MODEL, messages=HI, max_tokens=8, n=2, seed=11) for _ in range(2))
    assert [x.message.content for x in a.choices] == [x.message.content for x in b.choices]
    assert a.choices[0].message.content != a.choices[1].message.content
    one = c.chat.completions.create(model=MODEL, messages=HI, max_tokens=8, seed=12)
    assert one.choices[0].message.content == a.choices[1].message.content


def stopped(seq: list[str], stop: str) -> tuple[str, int]:
    """The text before `stop` and the tokens generated until one completed it."""
    text = ""
    for k, w in enumerate(seq):
        text += " " + w
        if stop in text:
            return text[:text.index(stop)], k + 1
    raise AssertionError("no stop")


def test_a_stop_string_ends_the_text_before_it(engine: EngineProcess) -> None:
    """v1/engine/detokenizer.py check_stop_strings: the text is cut before the stop string (after
    it with include_stop_str_in_output), finish_reason "stop", stop_reason the string; min_tokens:
    not looked for before (BaseIncrementalDetokenizer.update)."""
    c = client(engine)
    seq = words(engine, 21, 40)
    stop = " " + seq[5]
    before, used = stopped(seq, stop)
    got = c.completions.create(model=MODEL, prompt="p", max_tokens=40, seed=21, stop=[stop, "zzzz"])
    ch = got.choices[0]
    assert ch.text == before and ch.finish_reason == "stop"
    assert ch.model_extra is not None and ch.model_extra["stop_reason"] == stop
    assert got.usage is not None and got.usage.completion_tokens == used  # up to the token that completed it
    kept = c.completions.create(model=MODEL, prompt="p", max_tokens=40, seed=21, stop=stop,
                                extra_body={"include_stop_str_in_output": True})
    assert kept.choices[0].text == before + stop
    streamed = list(c.completions.create(model=MODEL, prompt="p", max_tokens=40, seed=21, stop=[stop], stream=True))
    assert "".join(x.choices[0].text for x in streamed) == before and streamed[-1].choices[0].finish_reason == "stop"
    late = c.completions.create(model=MODEL, prompt="p", max_tokens=40, seed=21, stop=[stop],
                                extra_body={"min_tokens": used + 1})
    assert late.usage is not None and late.usage.completion_tokens > used


def test_stop_token_ids_are_the_vocabulary_words(engine: EngineProcess) -> None:
    """v1/core/sched/utils.py check_stop: a token of stop_token_ids ends the sequence, "stop",
    stop_reason the id; its text is left out (detokenizer: stop-terminated). Word k of VOCAB is id k."""
    seq = words(engine, 33, 30)
    target = VOCAB.index(seq[4])
    got = client(engine).chat.completions.create(model=MODEL, messages=HI, max_tokens=30, seed=33,
                                                 extra_body={"stop_token_ids": [target]})
    first = seq.index(seq[4])
    ch = got.choices[0]
    assert ch.finish_reason == "stop" and ch.model_extra is not None and ch.model_extra["stop_reason"] == target
    assert ch.message.content == "".join(" " + w for w in seq[:first])
    assert got.usage is not None and got.usage.completion_tokens == first + 1


def test_n_choices_and_prompt_lists(engine: EngineProcess) -> None:
    """completion/serving.py: one choice per prompt x n, index = prompt_idx * n + output.index;
    usage counts every choice and each prompt once. The core runs every choice as a sequence."""
    c = client(engine)
    prompts = ["first prompt here", "second"]
    got = c.completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=4)
    assert [x.index for x in got.choices] == [0, 1, 2, 3]
    alone = c.completions.create(model=MODEL, prompt=prompts[1], max_tokens=4)
    assert got.choices[2].text == alone.choices[0].text  # prompt 1, choice 0
    assert got.usage is not None and alone.usage is not None
    assert got.usage.completion_tokens == 16 and got.usage.prompt_tokens == 5 + alone.usage.prompt_tokens
    ids = c.completions.create(model=MODEL, prompt=[[1, 2, 3], [4, 5]], max_tokens=2)
    assert len(ids.choices) == 2 and ids.usage is not None and ids.usage.prompt_tokens == 5
    c.chat.completions.create(model=MODEL, messages=HI, max_tokens=6, n=3)
    status, steps = get(f"{engine.base}/admin/steps")
    assert status == 200 and [s["decode_seqs"] for s in steps[-5:]] == [3] * 5  # one batch of 3 sequences


def test_logprobs_in_each_apis_shape(engine: EngineProcess) -> None:
    """chat_completion/serving.py _create_chat_logprobs: content entries {token, logprob, bytes,
    top_logprobs[top_logprobs]}; completion/serving.py _create_completion_logprobs: tokens,
    token_logprobs, top_logprobs (k per token), text_offset."""
    c = client(engine)
    chat = c.chat.completions.create(model=MODEL, messages=HI, max_tokens=5, logprobs=True, top_logprobs=3)
    entries = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert entries is not None and len(entries) == 5
    assert "".join(e.token for e in entries) == chat.choices[0].message.content
    for e in entries:
        assert e.logprob <= 0 and e.bytes == list(e.token.encode()) and len(e.top_logprobs) == 3
        assert e.top_logprobs[0].token == e.token and all(t.logprob <= e.logprob for t in e.top_logprobs)
    comp = c.completions.create(model=MODEL, prompt="x", max_tokens=4, logprobs=2)
    lp = comp.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.text_offset is not None and lp.top_logprobs is not None
    assert "".join(lp.tokens) == comp.choices[0].text and len(lp.token_logprobs or []) == 4
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:k]) for k in range(4)]
    assert all(len(top) == 2 for top in lp.top_logprobs)
    plain = c.chat.completions.create(model=MODEL, messages=HI, max_tokens=2)
    assert plain.choices[0].logprobs is None
    streamed = list(c.chat.completions.create(model=MODEL, messages=HI, max_tokens=3, logprobs=True, stream=True))
    assert sum(len(x.choices[0].logprobs.content or []) for x in streamed if x.choices and x.choices[0].logprobs) == 3


def test_response_format_is_valid_json(engine: EngineProcess) -> None:
    """response_format -> structured outputs (generate/base/protocol.py
    structured_outputs_from_response_format): the text is a JSON value for the schema, the same for
    the same seed; tokens counted as written (4 bytes each, then EOS); cut by max_tokens: "length"."""
    c = client(engine)
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    got = c.chat.completions.create(model=MODEL, messages=HI, response_format=fmt, seed=4)
    text = got.choices[0].message.content or ""
    jsonschema.validate(json.loads(text), SCHEMA)
    assert got.choices[0].finish_reason == "stop" and got.usage is not None
    assert got.usage.completion_tokens == math.ceil(len(text) / 4) + 1
    again = c.chat.completions.create(model=MODEL, messages=HI, response_format=fmt, seed=4)
    assert again.choices[0].message.content == text
    obj = c.completions.create(model=MODEL, prompt="json:", max_tokens=200, extra_body={
        "response_format": {"type": "json_object"}})
    assert isinstance(json.loads(obj.choices[0].text), dict)
    cut = c.chat.completions.create(model=MODEL, messages=HI, response_format=fmt, seed=4, max_tokens=3)
    assert cut.choices[0].finish_reason == "length" and cut.choices[0].message.content == text[:12]


def test_tools_without_a_parser_are_refused_or_ignored(engine: EngineProcess) -> None:
    """renderers/online_renderer.py render_chat: without --tool-call-parser, "auto" and "required"
    are 400 with vLLM's messages; "none" answers in text with the tools in the prompt."""
    c = client(engine)
    with pytest.raises(openai.BadRequestError, match="--enable-auto-tool-choice and --tool-call-parser"):
        c.chat.completions.create(model=MODEL, messages=HI, tools=TOOLS, tool_choice="auto")
    with pytest.raises(openai.BadRequestError, match='tool_choice="required" requires --tool-call-parser'):
        c.chat.completions.create(model=MODEL, messages=HI, tools=TOOLS, tool_choice="required")
    got = c.chat.completions.create(model=MODEL, messages=HI, tools=TOOLS, tool_choice="none",
                                    max_tokens=3)
    plain = c.chat.completions.create(model=MODEL, messages=HI, max_tokens=3)
    assert got.choices[0].message.tool_calls is None and got.choices[0].finish_reason == "length"
    assert got.usage is not None and plain.usage is not None and got.usage.prompt_tokens > plain.usage.prompt_tokens


def _args(call: Any) -> dict[str, Any]:
    assert call.type == "function" and call.id.startswith("chatcmpl-tool-") and call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, TOOLS[0]["function"]["parameters"])
    return dict(args)


def test_tool_calls_with_a_parser(tooled: EngineProcess) -> None:
    """chat_completion/serving.py chat_completion_full_generator: "required" and a named function
    are guided to the parameters' schema, message.tool_calls (id, type "function", arguments a
    JSON string); finish_reason "tool_calls" for required and auto, "stop" for a named function;
    auto answers in text once a tool has answered."""
    c = client(tooled)
    required = c.chat.completions.create(model=MODEL, messages=HI, tools=TOOLS, tool_choice="required", seed=2)
    calls: Any = required.choices[0].message.tool_calls
    assert required.choices[0].finish_reason == "tool_calls" and _args(calls[0])
    named = c.chat.completions.create(model=MODEL, messages=HI, tools=TOOLS, seed=2,
                                      tool_choice={"type": "function", "function": {"name": "get_weather"}})
    calls = named.choices[0].message.tool_calls
    assert named.choices[0].finish_reason == "stop" and _args(calls[0])
    auto = c.chat.completions.create(model=MODEL, messages=HI, tools=TOOLS, seed=2)
    auto_calls: Any = auto.choices[0].message.tool_calls
    call = auto_calls[0]
    assert auto.choices[0].finish_reason == "tool_calls" and auto.choices[0].message.content is None and _args(call)
    answered = [*HI, {"role": "assistant", "tool_calls": [call.model_dump()]},
                {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    final = c.chat.completions.create(model=MODEL, messages=answered, tools=TOOLS, max_tokens=5)
    assert final.choices[0].message.tool_calls is None and final.choices[0].finish_reason == "length"
    stream = c.chat.completions.create(model=MODEL, messages=HI, tools=TOOLS, tool_choice="required", seed=2,
                                       stream=True)
    deltas = [ch.choices[0] for ch in stream if ch.choices]
    parts = [d.delta.tool_calls[0] for d in deltas if d.delta.tool_calls]
    assert parts[0].id == call.id and parts[0].function is not None and parts[0].function.name == "get_weather"
    required_calls: Any = required.choices[0].message.tool_calls
    assert "".join((p.function.arguments or "") for p in parts if p.function) == required_calls[0].function.arguments
    assert deltas[-1].finish_reason == "tool_calls"
    status, body = post(f"{tooled.base}/v1/chat/completions", {"model": MODEL, "messages": HI, "tools": TOOLS,
                                                                "tool_choice": "required", "max_tokens": 3})
    assert status == 200 and body["choices"][0]["finish_reason"] == "length"
    assert "tool_calls" not in body["choices"][0]["message"]  # cut short: nothing to parse
