"""The part of the OpenAI API (as vLLM serves it) that engines and the router both speak: errors in
OpenAI's shape, reading a request body, usage, SSE framing and the model list. What vLLM's request
models check, and the bodies it answers with, are the simulated engine's (`simengine.protocol`,
`simengine.responses`); the prompt reading shared with the router is `wire.prompt`."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from wire.errors import ApiError

__all__ = ["DONE", "INT64", "MAX_LOGPROBS", "MAX_STOP_STRINGS", "load_body", "models_body", "sse", "usage"]

JSON = dict[str, Any]
API_KEY_ENV = "VLLM_API_KEY"
"""The key the API routes want, as vLLM reads it (its `--api-key`): every path under /v1, /v2 and
/inference needs `Authorization: Bearer <it>` (vLLM's AuthenticationMiddleware; /health,
/metrics, /tokenize and the rest stay open); the controller starts its engines with one."""
ADMIN_TOKEN_ENV = "ISLE_ENGINE_ADMIN_TOKEN"
"""With --admin-routes: the token they need, when set (from the environment: argv is public)."""
MAX_STOP_STRINGS = 4
"""VLLM_MAX_STOP_STRINGS (vllm/envs.py): the engine's limit, and the document's."""
MAX_LOGPROBS = 20
"""ModelConfig.max_logprobs (vllm/config/model.py), the default of --max-logprobs."""
INT64 = (-(2**63), 2**63 - 1)
"""The bounds of an integer field vLLM passes to torch (`seed`)."""


def load_body(body_bytes: bytes) -> JSON:
    try:
        body = orjson.loads(body_bytes)
    except orjson.JSONDecodeError:
        raise ApiError(400, "request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    return body


def usage(prompt_tokens: int, completion_tokens: int) -> JSON:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def sse(body: JSON) -> bytes:
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def models_body(model_ids: list[str], owner: str = "isleserve", contexts: Mapping[str, int] | None = None,
                cards: Sequence[Mapping[str, Any]] = ()) -> bytes:
    """The model list; `contexts`: each model's `max_model_len` where known (vLLM's ModelCard field);
    `cards`: more after them (LoRA adapters, as vLLM lists them: `root` the path, `parent` the base)."""
    known = contexts or {}
    return json.dumps({"object": "list", "data": [
        *({"id": m, "object": "model", "created": 0, "owned_by": owner,
           **({"max_model_len": known[m]} if known.get(m) else {})} for m in model_ids), *cards]}).encode()
