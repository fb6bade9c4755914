"""What a request asks the model to read: one reading of the prompt for everyone who needs it
(the simulated engine counts and generates from it; the router takes its token count for the
PD threshold and its first tokens for the prefix key; the load generator and the simulator
size requests with it), over every shape the OpenAI API and vLLM accept:

- chat `messages`: each message as `<|role|>content` on its own line (system, developer, user,
  assistant, tool alike); content as a string or as parts, the text parts joined with newlines
  as vLLM's chat parsing joins them (`_parse_chat_message_content_parts`); an assistant's
  `tool_calls` (name and arguments) and the request's `tools` are read too, as a chat template
  renders them into the prompt;
- image, audio and video parts: no text, but tokens: a fixed estimate per part (below), so a
  picture does not make a prompt look empty and its text is kept;
- completions' `prompt`: a string, a list of strings, a list of token ids, a list of lists of
  token ids; each one prompt (vLLM serves the list as one request with a choice per prompt);
- the Responses API's `input` (a string: one user message; or a list of items: messages with
  string or part content, `function_call` and `function_call_output` items) after its
  `instructions` (a system message), read as the chat messages they stand for.

Token counts of text are the documented estimate of `wire.text.count_tokens`; token
ids count as themselves. The prefix key of token ids is their bytes, `BYTES_PER_TOKEN` per id,
so a shared prefix of ids keys alike as a shared prefix of text does.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

from wire.errors import ApiError
from wire.text import BYTES_PER_TOKEN, count_tokens

MEDIA_TOKENS = {"image_url": 576, "input_image": 576, "image_embeds": 576, "image_pil": 576,
                "input_audio": 750, "audio_url": 750, "video_url": 2304}
"""Tokens an image, audio or video part takes, estimated: an image as LLaVA-1.5 at 336 px sees
it ((336/14)^2 = 576 patches), audio as Qwen2-Audio's 25 tokens a second for 30 s, a video as 4
frames of images. A real model's count differs; what matters for routing is that it is not 0."""
TEXT_PARTS = frozenset({"text", "input_text", "output_text", "refusal"})
MAX_TOKEN_ID = 2**31 - 1


@dataclass(frozen=True, slots=True)
class Prompt:
    """One prompt as the model reads it."""

    text: str
    """Its text ('' for token ids)."""
    tokens: int
    """Its length in tokens (text estimated, media parts estimated, token ids exact)."""
    key: str
    """What its prefix key is taken from: the text, or the token ids as `BYTES_PER_TOKEN` chars each."""
    media: int = 0
    """Its image, audio and video parts (a text-only model refuses a prompt with any)."""


def _content(k: int, content: Any) -> tuple[str, int, int]:
    """A message's content: its text, the tokens of its media parts and their number."""
    if content is None:
        return "", 0, 0
    if isinstance(content, str):
        return content, 0, 0
    if not isinstance(content, list):
        raise ApiError(400, f"messages[{k}].content must be a string or a list of parts", param="messages")
    texts, media, parts = [], 0, 0
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str):
            raise ApiError(400, f"messages[{k}].content[{j}] must be an object with a 'type'", param="messages")
        if kind in TEXT_PARTS:
            text = part.get("text", part.get("refusal"))
            if not isinstance(text, str):
                raise ApiError(400, f"messages[{k}].content[{j}] of type {kind!r} needs a string 'text'",
                               param="messages")
            texts.append(text)
        elif kind in MEDIA_TOKENS:
            media += MEDIA_TOKENS[kind]
            parts += 1
        else:
            raise ApiError(400, f"messages[{k}].content[{j}]: unknown content part type {kind!r}", param="messages")
    return "\n".join(texts), media, parts


def _tool_calls(calls: Any) -> str:
    if not isinstance(calls, list):
        return ""
    out = []
    for c in calls:
        fn = c.get("function") if isinstance(c, dict) else None
        if isinstance(fn, dict):
            out.append(f"{fn.get('name', '')}({fn.get('arguments', '')})")
    return "\n".join(out)


def chat_prompt(messages: Any, tools: Any = None) -> Prompt:
    """A chat request's prompt: its messages (and tools) as one text, with its media tokens."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list", param="messages")
    lines, media, parts = [], 0, 0
    if isinstance(tools, list) and tools:
        lines.append("<|tools|>" + json.dumps(tools, separators=(",", ":"), sort_keys=True, default=str))
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages[{k}] needs a 'role'", param="messages")
        text, extra, found = _content(k, m.get("content"))
        calls = _tool_calls(m.get("tool_calls"))
        lines.append(f"<|{m['role']}|>{text}" + (f"\n{calls}" if calls else ""))
        media += extra
        parts += found
    text = "\n".join(lines)
    return Prompt(text=text, tokens=count_tokens(text) + media, key=text, media=parts)


def chat_text(messages: Any) -> str:
    """The text of a chat request's messages (as `chat_prompt` reads them)."""
    return chat_prompt(messages).text


def _token_id(t: Any) -> int:
    """A token id as vLLM's (lax) pydantic reads one: an int, or a float with no fractional part
    (`5.0`); -1 for anything else."""
    if isinstance(t, bool):
        return -1
    if isinstance(t, int):
        return t
    if isinstance(t, float) and t.is_integer():
        return int(t)
    return -1


def _ids(raw: list[Any], where: str) -> Prompt:
    if not raw:
        raise ApiError(400, f"{where} is an empty list of token ids", param="prompt")
    ids = [_token_id(t) for t in raw]
    if not all(0 <= t <= MAX_TOKEN_ID for t in ids):
        raise ApiError(400, f"{where} must be token ids: integers from 0", param="prompt")
    assert BYTES_PER_TOKEN == 4  # one id packed in 4 bytes
    return Prompt(text="", tokens=len(ids), key=struct.pack(f"<{len(ids)}I", *ids).decode("latin-1"))


def _text(text: str) -> Prompt:
    return Prompt(text=text, tokens=count_tokens(text), key=text)


def completion_prompts(prompt: Any) -> tuple[Prompt, ...]:
    """A completion request's prompts: a string, strings, token ids, lists of token ids."""
    if isinstance(prompt, str):
        return (_text(prompt),)
    if not isinstance(prompt, list) or not prompt:
        raise ApiError(400, "'prompt' must be a string, a list of strings, token ids or lists of token ids",
                       param="prompt")
    if all(isinstance(p, str) for p in prompt):
        return tuple(_text(p) for p in prompt)
    if all(isinstance(p, list) for p in prompt):
        return tuple(_ids(p, f"prompt[{k}]") for k, p in enumerate(prompt))
    return (_ids(prompt, "'prompt'"),)


def _item(k: int, item: Any) -> dict[str, Any]:
    """One item of a Responses `input` as the chat message it stands for."""
    if not isinstance(item, dict):
        raise ApiError(400, f"input[{k}] must be an object", param="input")
    kind = item.get("type", "message")
    if kind == "function_call":
        return {"role": "assistant", "content": None, "tool_calls": [
            {"function": {"name": item.get("name", ""), "arguments": item.get("arguments", "")}}]}
    if kind == "function_call_output":
        output = item.get("output")
        return {"role": "tool", "content": output if isinstance(output, (str, list)) else json.dumps(output)}
    if kind == "reasoning":
        return {"role": "assistant", "content": None}
    if kind != "message":
        raise ApiError(400, f"input[{k}]: unknown input item type {kind!r}", param="input")
    return {"role": item.get("role"), "content": item.get("content")}


def responses_chat(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """A Responses request as the chat it stands for: its `instructions` (a system message) and
    `input` (module docstring) as messages, its function tools in the chat's shape."""
    given = body.get("input")
    if given is None or given in ("", []):
        raise ApiError(400, "'input' is required: a string or a list of input items", param="input")
    if isinstance(given, str):
        items: list[dict[str, Any]] = [{"role": "user", "content": given}]
    elif isinstance(given, list):
        items = [_item(k, item) for k, item in enumerate(given)]
    else:
        raise ApiError(400, "'input' must be a string or a list of input items", param="input")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ApiError(400, "'instructions' must be a string", param="instructions")
    system = [{"role": "system", "content": instructions}] if instructions else []
    given_tools = body.get("tools")
    tools: list[Any] = given_tools if isinstance(given_tools, list) else []
    functions = [{"type": "function", "function": {"name": t.get("name"), "parameters": t.get("parameters")}}
                 for t in tools if isinstance(t, dict) and t.get("type") == "function"]
    return system + items, functions or None


def responses_prompt(body: dict[str, Any]) -> Prompt:
    """A Responses request's prompt: the chat it stands for (`responses_chat`)."""
    messages, tools = responses_chat(body)
    return chat_prompt(messages, tools)


def read_prompts(body: dict[str, Any], kind: str = "") -> tuple[Prompt, ...]:
    """The prompts of a request body: `kind` "chat" (`messages`), "completion" (`prompt`) or
    "responses" (`input`); without a kind, a body with `messages` is a chat, else a completion.
    A body without its kind's field is told which field it lacks."""
    if kind == "responses":
        return (responses_prompt(body),)
    if kind == "chat" or (not kind and "messages" in body):
        if "messages" not in body:
            raise ApiError(400, "'messages' is required: a chat request's messages", param="messages")
        return (chat_prompt(body["messages"], body.get("tools")),)
    if kind == "completion" and "prompt" not in body:
        raise ApiError(400, "'prompt' is required: a completion request's prompt", param="prompt")
    return completion_prompts(body.get("prompt"))
