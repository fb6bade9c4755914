"""The part of the OpenAI API (as vLLM serves it) that engines and the router speak: request
fields, errors in OpenAI's shape, response and SSE chunk bodies. Plain dicts and orjson-free
json here; validation is explicit and reports the first problem with the field's name."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import orjson

from pools.wire.errors import ApiError, error_body
from pools.wire.prompt import Prompt, chat_prompt, chat_text, completion_prompts

__all__ = ["ApiError", "GenerationRequest", "chat_text", "error_body", "parse_generation"]

JSON = dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerationRequest:
    kind: str
    """'chat' or 'completion'."""
    model: str
    prompt_text: str
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    priority: int
    seed: int | None
    kv_transfer_params: JSON | None
    request_id: str | None


def _field(body: JSON, name: str, types: tuple[type, ...], default: Any) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in types:
        raise ApiError(400, f"'{name}' must be {types[0].__name__}", param=name)
    if not isinstance(value, types):
        raise ApiError(400, f"'{name}' must be {' or '.join(t.__name__ for t in types)}", param=name)
    return value


def load_body(body_bytes: bytes) -> JSON:
    try:
        body = orjson.loads(body_bytes)
    except orjson.JSONDecodeError:
        raise ApiError(400, "request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    return body


def _sampling(body: JSON) -> None:
    """Sampling parameters the simulated engine does not use, checked as OpenAI and vLLM check them."""
    temperature = _field(body, "temperature", (int, float), None)
    if temperature is not None and not 0 <= temperature <= 2:
        raise ApiError(400, f"'temperature' is {temperature}, not in [0, 2]", param="temperature")
    top_p = _field(body, "top_p", (int, float), None)
    if top_p is not None and not 0 < top_p <= 1:
        raise ApiError(400, f"'top_p' is {top_p}, not in (0, 1]", param="top_p")


def parse_generation(body_bytes: bytes | JSON, kind: str, max_model_len: int) -> GenerationRequest:
    body = load_body(body_bytes) if isinstance(body_bytes, bytes) else body_bytes
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "'model' is required", param="model")
    if kind == "chat":
        prompts: tuple[Prompt, ...] = (chat_prompt(body.get("messages"), body.get("tools")),)
    else:
        prompts = completion_prompts(body.get("prompt"))
        if len(prompts) != 1:
            raise ApiError(400, "'prompt' must be one prompt per request", param="prompt")
    n = _field(body, "n", (int,), 1)
    if n != 1:
        raise ApiError(400, "only n=1 is supported", param="n")
    max_tokens = _field(body, "max_completion_tokens", (int,), None)
    if max_tokens is None:
        max_tokens = _field(body, "max_tokens", (int,), 16)
    if max_tokens < 1:
        raise ApiError(400, "'max_tokens' must be at least 1", param="max_tokens")
    if max_tokens > max_model_len:
        raise ApiError(400, f"'max_tokens' is {max_tokens}, more than the model's context of {max_model_len} tokens",
                       param="max_tokens")
    _sampling(body)
    stream = _field(body, "stream", (bool,), False)
    options = _field(body, "stream_options", (dict,), {})
    params = body.get("kv_transfer_params")
    if params is not None and not isinstance(params, dict):
        raise ApiError(400, "'kv_transfer_params' must be an object", param="kv_transfer_params")
    return GenerationRequest(
        kind=kind, model=model, prompt_text=prompts[0].text, prompt_tokens=prompts[0].tokens,
        max_tokens=max_tokens, stream=stream,
        include_usage=bool(options.get("include_usage")), priority=_field(body, "priority", (int,), 0),
        seed=_field(body, "seed", (int,), None), kv_transfer_params=params,
        request_id=_field(body, "request_id", (str,), None),
    )


def usage(prompt_tokens: int, completion_tokens: int) -> JSON:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def full_response(req: GenerationRequest, rid: str, text: str, finish: str, prompt_tokens: int,
                  completion_tokens: int, extra: JSON | None = None) -> JSON:
    created = int(time.time())
    if req.kind == "chat":
        choice: JSON = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                        "finish_reason": finish}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    out = {"id": rid, "object": obj, "created": created, "model": req.model, "choices": [choice],
           "usage": usage(prompt_tokens, completion_tokens)}
    if extra:
        out.update(extra)
    return out


def chunk(req: GenerationRequest, rid: str, created: int, text: str | None, finish: str | None,
          first: bool = False) -> bytes:
    if req.kind == "chat":
        delta: JSON = {"role": "assistant", "content": text or ""} if first else \
            ({"content": text} if text is not None else {})
        choice: JSON = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    body = {"id": rid, "object": obj, "created": created, "model": req.model, "choices": [choice]}
    return sse(body)


class ChunkWriter:
    """SSE content chunks of one response, with the constant JSON around the text built once
    (a stream's chunks differ only in their text): the per-token cost is one json.dumps of a
    short string."""

    def __init__(self, req: GenerationRequest, rid: str, created: int) -> None:
        self.req, self.rid, self.created = req, rid, created
        head = json.dumps({"id": rid, "object": "chat.completion.chunk" if req.kind == "chat" else "text_completion",
                           "created": created, "model": req.model}, separators=(",", ":"))[:-1]
        if req.kind == "chat":
            self._prefix = f'data: {head},"choices":[{{"index":0,"delta":{{"content":'.encode()
            self._suffix = b'},"logprobs":null,"finish_reason":null}]}\n\n'
        else:
            self._prefix = f'data: {head},"choices":[{{"index":0,"text":'.encode()
            self._suffix = b',"logprobs":null,"finish_reason":null}]}\n\n'

    def content(self, text: str, first: bool = False) -> bytes:
        if first and self.req.kind == "chat":
            return chunk(self.req, self.rid, self.created, text, None, first=True)
        return self._prefix + json.dumps(text).encode() + self._suffix

    def finish(self, reason: str) -> bytes:
        return chunk(self.req, self.rid, self.created, None, reason)


def usage_chunk(req: GenerationRequest, rid: str, created: int, prompt_tokens: int, completion_tokens: int) -> bytes:
    obj = "chat.completion.chunk" if req.kind == "chat" else "text_completion"
    return sse({"id": rid, "object": obj, "created": created, "model": req.model, "choices": [],
                "usage": usage(prompt_tokens, completion_tokens)})


def sse(body: JSON) -> bytes:
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def models_body(model_ids: list[str], owner: str = "isleserve") -> bytes:
    return json.dumps({"object": "list", "data": [
        {"id": m, "object": "model", "created": 0, "owned_by": owner} for m in model_ids]}).encode()
