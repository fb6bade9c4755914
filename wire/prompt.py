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
  token ids; each one prompt (vLLM serves the list as one request with a choice per prompt).

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


def _content(k: int, content: Any) -> tuple[str, int]:
    """A message's content: its text and the tokens of its media parts."""
    if content is None:
        return "", 0
    if isinstance(content, str):
        return content, 0
    if not isinstance(content, list):
        raise ApiError(400, f"messages[{k}].content must be a string or a list of parts", param="messages")
    texts, media = [], 0
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
        else:
            raise ApiError(400, f"messages[{k}].content[{j}]: unknown content part type {kind!r}", param="messages")
    return "\n".join(texts), media


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
    lines, media = [], 0
    if isinstance(tools, list) and tools:
        lines.append("<|tools|>" + json.dumps(tools, separators=(",", ":"), sort_keys=True, default=str))
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages[{k}] needs a 'role'", param="messages")
        text, extra = _content(k, m.get("content"))
        calls = _tool_calls(m.get("tool_calls"))
        lines.append(f"<|{m['role']}|>{text}" + (f"\n{calls}" if calls else ""))
        media += extra
    text = "\n".join(lines)
    return Prompt(text=text, tokens=count_tokens(text) + media, key=text)


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


def read_prompts(body: dict[str, Any]) -> tuple[Prompt, ...]:
    """The prompts of a chat (`messages`) or completion (`prompt`) request body."""
    if "messages" in body:
        return (chat_prompt(body["messages"], body.get("tools")),)
    return completion_prompts(body.get("prompt"))
