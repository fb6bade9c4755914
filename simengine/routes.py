"""The simulated engine's routes and what FastAPI and vLLM answer around them: 404 for an
unknown path, 405 for a known one with the wrong method, 400 for a JSON route's body that is not
JSON (vLLM's `validate_json_request`: the content type must be application/json), all in vLLM's
error shape (vllm/entrypoints/serve/exception_handling/handlers/http.py: `type` is the status's
phrase)."""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable
from typing import Any

import orjson

from wire.errors import ApiError, error_body
from wire.fields import VALIDATION, Errors
from wire.reader import Request
from wire.responder import Responder

ROUTES: dict[str, tuple[str, ...]] = {
    "/v1/chat/completions": ("POST",),
    "/v1/completions": ("POST",),
    "/v1/responses": ("POST",),
    "/v1/models": ("GET",),
    "/tokenize": ("POST",),
    "/detokenize": ("POST",),
    "/health": ("GET",),
    "/version": ("GET",),
    "/metrics": ("GET",),
    "/internal/kv/release": ("POST",),
    "/admin/faults": ("GET", "POST"),
    "/admin/steps": ("GET",),
    "/v1/load_lora_adapter": ("POST",),
    "/v1/unload_lora_adapter": ("POST",),
}
"""Path -> methods (a GET route answers HEAD too, as Starlette's)."""
ADMIN_PREFIX = "/admin/"
LORA_ROUTES = frozenset({"/v1/load_lora_adapter", "/v1/unload_lora_adapter"})
"""Served only with VLLM_ALLOW_RUNTIME_LORA_UPDATING (`simengine.lora`)."""
TEXT = "text/plain; charset=utf-8"
UNAUTHORIZED = b'{"error":"Unauthorized"}'
"""vLLM's answer to a request under a guarded prefix without the key (401)."""
GUARDED_PREFIXES = ("/v1", "/v2", "/inference")
"""The paths vLLM 0.32's `--api-key` guards (vllm/entrypoints/serve/middleware/authenticate.py
`AuthenticationMiddleware`, before any route: an unknown path under them is 401, not 404); the
rest (/health, /metrics, /tokenize, /detokenize, /version) is open."""
JSON_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses", "/tokenize", "/detokenize",
                         *LORA_ROUTES})
VLLM_VERSION = "0.32.0"


def allow(methods: tuple[str, ...]) -> str:
    return ", ".join([*methods, "HEAD"] if "GET" in methods else methods)


def refuse_route(request: Request, response: Responder, admin: bool = False, lora: bool = False) -> bool:
    """Answer a request no route takes (404, or 405 with `Allow`); False when a route takes it.
    The `/admin/` routes exist only for an engine started with them (`admin`), the LoRA load and
    unload routes only with runtime updating allowed (`lora`)."""
    methods = ROUTES.get(request.path)
    if methods is None or (not admin and request.path.startswith(ADMIN_PREFIX)) or (
            not lora and request.path in LORA_ROUTES):
        response.send(404, error_body(404, "Not Found", "Not Found"))
        return True
    if request.method not in methods:
        response.send(405, error_body(405, "Method Not Allowed", "Method Not Allowed"),
                      headers=(("allow", allow(methods)),))
        return True
    return False


def bearer_is(request: Request, token: str) -> bool:
    """The request carries `Authorization: Bearer <token>` (compared in constant time)."""
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


def json_body(request: Request) -> dict[str, Any]:
    """A JSON route's body, refused as FastAPI and vLLM refuse it (400, "Bad Request")."""
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise ApiError(400, "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed",
                       VALIDATION)
    errors = Errors()
    try:
        body = orjson.loads(request.body)
    except orjson.JSONDecodeError as err:
        errors.add("json_invalid", f"body.{err.pos}", "JSON decode error", {})
        errors.raise_any()
        raise AssertionError("unreachable") from None
    if not isinstance(body, dict):
        errors.add("model_attributes_type", "body", "Input should be a valid dictionary or object to extract fields "
                   "from", body)
        errors.raise_any()
    assert isinstance(body, dict)
    return body


def models_body(model: str, max_model_len: int,
                adapters: Callable[[int], list[dict[str, Any]]] | None = None) -> bytes:
    """vLLM's ModelList: the base model's ModelCard (vllm/entrypoints/serve/engine/protocol.py),
    then each adapter's (`adapters(created)`, `simengine.lora.Adapters.cards`)."""
    created = int(time.time())
    extra = adapters(created) if adapters is not None else []
    return orjson.dumps({"object": "list", "data": [{
        "id": model, "object": "model", "created": created, "owned_by": "vllm", "root": model, "parent": None,
        "max_model_len": max_model_len, "permission": [{
            "id": f"modelperm-{model}", "object": "model_permission", "created": created,
            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False, "organization": "*",
            "group": None, "is_blocking": False}]}, *extra]})


def version_body() -> bytes:
    return orjson.dumps({"version": VLLM_VERSION})
