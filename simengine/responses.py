"""Response bodies and SSE chunks as vLLM 0.32 writes them (vllm/entrypoints/openai/
chat_completion/serving.py and completion/serving.py, their protocol.py models): one choice per
sequence, `index` as vLLM gives it (completions: prompt x n + choice), `finish_reason` and
vLLM's `stop_reason`, logprobs in each API's shape, tool calls, usage over every choice.

Streams: chat sends, with the first token, a role chunk per choice (`{"role": "assistant",
"content": ""}`), then one chunk per token, the last one carrying `finish_reason`; a usage chunk
(`stream_options.include_usage`) closes, then `[DONE]`. JSON is compact, as pydantic writes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from simengine import toolcall
from simengine.output import Output, Token
from simengine.protocol import EngineRequest

JSON = dict[str, Any]


@dataclass(slots=True, eq=False)
class Choice:
    """One sequence of a request: its place in the response and what it generated so far."""

    index: int
    prompt: int
    """Which of the request's prompts it continues."""
    rid: str
    """Its id in the batching core."""
    out: Output
    tool: toolcall.ToolPlan | None
    prompt_tokens: int
    max_tokens: int
    tokens: list[Token] = field(default_factory=list)
    """Kept when logprobs are asked for."""
    text_offset: int = 0
    arrival_v: float = 0.0
    scheduled_v: float | None = None
    first_v: float | None = None
    last_v: float | None = None
    preemptions: int = 0
    named: bool = False
    """A streamed tool call's first delta (with its id and name) went out."""

    @property
    def emitted(self) -> int:
        return len(self.out.token_ids)


def usage(prompt_tokens: int, completion_tokens: int) -> JSON:
    return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens, "prompt_tokens_details": None}


def total_usage(choices: list[Choice]) -> JSON:
    prompts = {c.prompt: c.prompt_tokens for c in choices}
    return usage(sum(prompts.values()), sum(c.emitted for c in choices))


def _chat_entry(t: Token, k: int) -> JSON:
    return {"token": t.piece, "logprob": t.logprob, "bytes": list(t.piece.encode()),
            "top_logprobs": [{"token": s, "logprob": lp, "bytes": list(s.encode())} for s, lp in t.top[:k]]}


def chat_logprobs(tokens: list[Token], k: int) -> JSON:
    """ChatCompletionLogProbs: `content`, an entry per token (`_create_chat_logprobs`)."""
    return {"content": [_chat_entry(t, k) for t in tokens]}


def completion_logprobs(tokens: list[Token], offset: int) -> JSON:
    """CompletionLogProbs (`_create_completion_logprobs`): the sampled token and the top ones per
    token, `text_offset` from `offset` on by the tokens' lengths."""
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t.piece)
    return {"text_offset": offsets, "token_logprobs": [t.logprob for t in tokens], "tokens": [t.piece for t in tokens],
            "top_logprobs": [dict(t.top) for t in tokens]}


def _finish(c: Choice, tool_calls: bool) -> str | None:
    reason = c.out.finish
    if reason == "stop" and c.tool is not None and c.tool.mode != "named" and tool_calls:
        return "tool_calls"  # vLLM: "tool_calls" for auto and required, "stop" for a named function
    return reason


def _message(c: Choice) -> tuple[JSON, bool]:
    content: str | None = c.out.text
    calls: list[JSON] = []
    if c.tool is not None:
        content, calls = toolcall.parse(c.tool, c.out.text)
        if c.tool.mode != "auto":
            content = content or ""
    message: JSON = {"role": "assistant", "content": content, "refusal": None}
    if calls:
        message["tool_calls"] = calls
    message["reasoning"] = None
    has_calls = bool(calls) or (c.tool is not None and c.tool.mode == "required")
    return message, has_calls


def full(req: EngineRequest, rid: str, created: int, model: str, choices: list[Choice], extra: JSON) -> JSON:
    out = []
    for c in choices:
        k = req.sampling.logprobs
        if req.kind == "chat":
            message, calls = _message(c)
            out.append({"index": c.index, "message": message,
                        "logprobs": chat_logprobs(c.tokens, k) if k is not None else None,
                        "finish_reason": _finish(c, calls), "stop_reason": c.out.stop_reason, "token_ids": None})
        else:
            out.append({"index": c.index, "text": c.out.text,
                        "logprobs": completion_logprobs(c.tokens, 0) if k is not None else None,
                        "finish_reason": c.out.finish, "stop_reason": c.out.stop_reason, "prompt_logprobs": None})
    body: JSON = {"id": rid, "object": "chat.completion" if req.kind == "chat" else "text_completion",
                  "created": created, "model": model, "choices": out, "usage": total_usage(choices)}
    if req.kind == "chat":
        body["system_fingerprint"] = None
    body.update(extra)
    return body


def sse(body: JSON) -> bytes:
    return b"data: " + orjson.dumps(body) + b"\n\n"


class Chunks:
    """The SSE chunks of one streamed response."""

    def __init__(self, req: EngineRequest, rid: str, created: int, model: str) -> None:
        self.req = req
        self.chat = req.kind == "chat"
        self._head = orjson.dumps({"id": rid, "object": "chat.completion.chunk" if self.chat else "text_completion",
                                   "created": created, "model": model})[:-1] + b',"choices":['
        self.fast = req.sampling.logprobs is None and not req.continuous_usage and not req.tools
        self._key = b'{"index":%d,"delta":{"content":' if self.chat else b'{"index":%d,"text":'
        self._tail = b'},"logprobs":null,"finish_reason":null,"token_ids":null}]}\n\n' if self.chat else \
            b',"logprobs":null,"finish_reason":null}]}\n\n'

    def _chunk(self, choice: JSON, extra: JSON | None = None) -> bytes:
        body = self._head + orjson.dumps(choice) + b"]"
        if extra:
            body += b"," + orjson.dumps(extra)[1:-1]
        return b"data: " + body + b"}\n\n"

    def roles(self, choices: list[Choice]) -> bytes:
        """Chat's first chunks: the role, one per choice."""
        extra = {"usage": usage(choices[0].prompt_tokens, 0)} if self.req.continuous_usage else None
        return b"".join(self._chunk({"index": c.index, "delta": {"role": "assistant", "content": ""},
                                     "logprobs": None, "finish_reason": None}, extra) for c in choices)

    def token(self, c: Choice, t: Token) -> bytes:
        """The chunk of one token of choice `c` (empty bytes: this token streams nothing)."""
        if self.fast and t.finish is None:
            return b"data: " + self._head + (self._key % c.index) + orjson.dumps(t.delta) + self._tail
        k = self.req.sampling.logprobs
        entry: JSON = {"index": c.index}
        if self.chat:
            delta: JSON = {"content": t.delta}
            if c.tool is not None:
                found = toolcall.stream_delta(c.tool, t.start, t.start + len(t.delta), c.named)
                c.named = c.named or found is not None
                delta = {"tool_calls": [found]} if found is not None else {}
                if found is None and t.finish is None and k is None:
                    return b""
            entry["delta"] = delta
            entry["logprobs"] = {"content": [_chat_entry(t, k)]} if k is not None else None
        else:
            entry["text"] = t.delta
            entry["logprobs"] = completion_logprobs([t], c.text_offset) if k is not None else None
            c.text_offset += len(t.piece)
        entry["finish_reason"] = _finish(c, c.named) if t.finish else None  # named: a tool call streamed
        if t.finish:
            entry["stop_reason"] = t.stop_reason
        extra = {"usage": usage(c.prompt_tokens, c.emitted)} if self.req.continuous_usage else None
        return self._chunk(entry, extra)

    def usage(self, choices: list[Choice], extra: JSON) -> bytes:
        """The last chunk: no choices, the usage of all of them (and the engine's extras)."""
        return b"data: " + self._head + b"]," + orjson.dumps({"usage": total_usage(choices), **extra})[1:-1] + b"}\n\n"


DONE = b"data: [DONE]\n\n"
