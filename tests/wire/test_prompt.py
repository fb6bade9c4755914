"""One reading of the prompt (wire.prompt) for every shape the OpenAI API and vLLM accept:
the engine counts from it and the router routes on it, so the two can never disagree."""

from __future__ import annotations

from typing import Any

import pytest

from wire.errors import ApiError
from wire.prompt import MEDIA_TOKENS, chat_prompt, completion_prompts, read_prompts
from wire.text import count_tokens

pytestmark = pytest.mark.unit

TEXT = "an island of eight GPUs joined by NVLink " * 30


def test_string_and_text_parts_read_alike() -> None:
    """vLLM joins a message's text parts with newlines (chat_utils._parse_chat_message_content_parts)."""
    one = chat_prompt([{"role": "user", "content": "a\nb"}])
    parts = chat_prompt([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    assert one == parts and one.tokens == count_tokens("<|user|>a\nb")


def test_media_parts_count_without_dropping_text() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    p = chat_prompt([{"role": "user", "content": [{"type": "text", "text": TEXT}, image, audio]}])
    assert TEXT in p.text
    assert p.tokens == count_tokens(p.text) + MEDIA_TOKENS["image_url"] + MEDIA_TOKENS["input_audio"]
    only_image = chat_prompt([{"role": "user", "content": [image]}])
    assert only_image.tokens > MEDIA_TOKENS["image_url"] - 1  # a picture alone is not an empty prompt


def test_every_role_and_tool_calls_and_tools_are_read() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "be brief"}, {"role": "developer", "content": "use tools"},
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "rain, 4 C"}]}]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    p = chat_prompt(messages, tools)
    for piece in ("<|system|>be brief", "<|developer|>use tools", "get_weather({\"city\": \"Oslo\"})",
                  "<|tool|>rain, 4 C", '"name":"get_weather"'):
        assert piece in p.text
    assert p.tokens > chat_prompt(messages).tokens  # the tools' schema is part of what the model reads


@pytest.mark.parametrize("prompt,count", [
    ("hello there", 1), (["a", "b", "c"], 3), ([1, 2, 3], 1), ([[1, 2], [3, 4, 5]], 2), (["only"], 1)])
def test_completion_prompt_shapes(prompt: Any, count: int) -> None:
    got = completion_prompts(prompt)
    assert len(got) == count
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        assert got[0].tokens == len(prompt)
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        assert [p.tokens for p in got] == [2, 3]


def test_token_ids_key_like_text_by_their_prefix() -> None:
    a, b = completion_prompts([[7] * 100 + [1]])[0], completion_prompts([[7] * 100 + [2]])[0]
    assert a.key[:400] == b.key[:400] and a.key != b.key and len(a.key) == 4 * 101


@pytest.mark.parametrize("body,param", [
    ({"prompt": []}, "prompt"), ({"prompt": [1, "a"]}, "prompt"), ({"prompt": [[]]}, "prompt"),
    ({"prompt": [-1]}, "prompt"), ({"prompt": {"x": 1}}, "prompt"), ({"prompt": [True]}, "prompt"),
    ({"messages": []}, "messages"), ({"messages": [{"content": "x"}]}, "messages"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "sound", "x": 1}]}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages"),
    ({"messages": [{"role": "user", "content": ["just a string"]}]}, "messages")])
def test_bad_prompts_are_400_naming_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as err:
        read_prompts(body)
    assert err.value.status == 400 and err.value.param == param


def test_token_ids_read_as_vllms_lax_pydantic_reads_them() -> None:
    """vLLM's `list[int]` (lax pydantic) takes a float with no fractional part as its integer;
    the router and engine read such a prompt alike, and still refuse 1.5, true and -1."""
    (whole,) = completion_prompts([9358.0, 12, 7.0])
    (exact,) = completion_prompts([9358, 12, 7])
    assert whole == exact
    for bad in ([1.5], [True], [-1], [float("nan")]):
        with pytest.raises(ApiError):
            completion_prompts(bad)
