"""The router's OpenAPI 3.1 document, generated from pydantic models (as FastAPI generates
vLLM's from its protocol models): the request and answer bodies of the OpenAI API
(`wire.protocol`), the router's own answers (`router.views`), every route the router
serves, bearer keys, the `x-slo-class` header with this router's classes and its
`max_tokens_limit`. Built once when the router starts and served as is at `/openapi.json`.

The schemas are the models' JSON Schema (draft 2020-12, OpenAPI 3.1's dialect) with their
`$defs` under `components.schemas`; nothing is written by hand but the paths and their words.
"""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from pydantic import BaseModel, Field, create_model
from pydantic.json_schema import models_json_schema

from router import targets, views
from wire import protocol as wire
from wire.reader import MAX_HEAD_BYTES, MAX_HEADER_COUNT

JSON = dict[str, Any]
REF = "#/components/schemas/{model}"
BEARER: list[dict[str, list[str]]] = [{"bearer": []}]
GENERATE_ERRORS = (400, 401, 403, 404, 408, 413, 429, 431, 501, 502, 503)
TOKEN_ERRORS = (400, 401, 404, 502, 503)
ADMIN_ERRORS = (401, 403, 404)
OVERLOADED = frozenset({429, 503})
"""Statuses the router sends with Retry-After."""
SLO_CLASS_WORDS = ("narrow the request to one SLO class: 400 for a class that does not exist, 403 for one the key "
                   "is not entitled to (absent: the configured default, else the key's strictest class)")
STREAM_WORDS = "server-sent events: `data: <{chunk} JSON>` per event, then `data: [DONE]`"


def _description() -> str:
    return ("The OpenAI-compatible API of the isleserve router, generated from its pydantic models. Every key, "
            "admin included, comes as `Authorization: Bearer <key>`. Errors have OpenAI's shape. Connection limits "
            f"(docs/security.md, Front door): a head over {MAX_HEAD_BYTES // 1024} KiB or {MAX_HEADER_COUNT} headers "
            "is 431, "
            "a Transfer-Encoding other than chunked 501, a repeated Host/Authorization/Content-Length/X-SLO-Class "
            "or HTTP/1.1 without Host 400, the router's connection or buffered-bytes cap 503 with Retry-After.")


def limited(model: type[BaseModel], max_tokens_limit: int) -> type[BaseModel]:
    """`model` as this router takes it: max_tokens (chat's max_completion_tokens, the Responses
    API's max_output_tokens) at most
    its `max_tokens_limit` (the router answers 400 above it, before any engine sees it)."""
    words = (f"Absent: up to the model's context (vLLM); at most this router's `max_tokens_limit` "
             f"({max_tokens_limit}); with the prompt, at most the model's context (else 400, as vLLM).")
    bound = Annotated[int | None, Field(ge=1, le=max_tokens_limit, description=words)]
    fields: dict[str, Any] = {name: (bound, None) for name in ("max_tokens", "max_completion_tokens",
                                                               "max_output_tokens") if name in model.model_fields}
    made: type[BaseModel] = create_model(model.__name__, __base__=model, __doc__=model.__doc__,
                                            __cls_kwargs__={"use_attribute_docstrings": False}, **fields)
    return made


def _schemas(models: list[type[BaseModel]]) -> tuple[dict[str, JSON], JSON]:
    """Each model's `$ref` by name, and every schema (definitions included) by name."""
    refs, top = models_json_schema([(m, "validation") for m in models], ref_template=REF)
    by_name = {m.__name__: refs[(m, "validation")] for m in models}
    return by_name, _tidy(top.get("$defs", {}))


def _tidy(node: Any) -> Any:
    """Descriptions on one line (attribute docstrings keep their line breaks), and no `default:
    null` on a field that may be absent but not null (`wire.protocol.Absent`: pydantic
    writes the default, which its own schema does not take; a nullable field is an anyOf)."""
    if isinstance(node, dict):
        return {k: " ".join(v.split()) if k == "description" and isinstance(v, str) else _tidy(v)
                for k, v in node.items() if not (k == "default" and v is None and "anyOf" not in node)}
    if isinstance(node, list):
        return [_tidy(v) for v in node]
    return node


def _json(ref: JSON, description: str) -> JSON:
    return {"description": description, "content": {"application/json": {"schema": ref}}}


def _errors(statuses: tuple[int, ...]) -> JSON:
    out: JSON = {str(s): {"$ref": "#/components/responses/" + ("Overloaded" if s in OVERLOADED else "Error")}
                 for s in statuses}
    out["405"] = {"$ref": "#/components/responses/MethodNotAllowed"}
    return out


def _operation(op_id: str, summary: str, ok: JSON, errors: tuple[int, ...] = (), *, tag: str,
               secured: bool = True, body: JSON | None = None, parameters: list[JSON] | None = None,
               description: str | None = None) -> JSON:
    op: JSON = {"tags": [tag], "summary": summary, "operationId": op_id, "security": BEARER if secured else []}
    if description:
        op["description"] = description
    if parameters:
        op["parameters"] = parameters
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    op["responses"] = {"200": ok, **_errors(errors)}
    return op


def _generate(op_id: str, summary: str, kind: str, body: JSON, answer: JSON, chunk: str, slo: JSON) -> JSON:
    ok = {"description": f"a {kind} (JSON), or its chunks as server-sent events when `stream` is true",
          "content": {"application/json": {"schema": answer},
                      "text/event-stream": {"schema": {"description": STREAM_WORDS.format(chunk=chunk)}}}}
    return _operation(op_id, f"create {summary}", ok, GENERATE_ERRORS, tag="openai", body=body, parameters=[slo])


def _api_paths(ref: dict[str, JSON], classes: list[str], tokenize_key: bool) -> JSON:
    """The OpenAI API's routes and vLLM's (de)tokenize (open as on vLLM, unless `tokenize_key`)."""
    slo = {"name": "x-slo-class", "in": "header", "required": False, "description": SLO_CLASS_WORDS,
           "schema": {"type": "string", "enum": classes}}
    model = {"name": "model", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
    token_errors = TOKEN_ERRORS if tokenize_key else tuple(e for e in TOKEN_ERRORS if e != 401)
    token_words = ("needs a key (the router's `tokenize_auth: key`)" if tokenize_key else
                   "open, as on vLLM (its --api-key guards only /v1, /v2, /inference); the router's "
                   "`tokenize_auth: key` asks for a key")
    tokenize = {"anyOf": [ref["TokenizeCompletionRequest"], ref["TokenizeChatRequest"]],
                "description": "vLLM's TokenizeCompletionRequest or TokenizeChatRequest; answered by a replica of "
                               "the model"}
    return {
        "/v1/chat/completions": {"post": _generate(
            "create_chat_completion", "chat completion", "chat.completion", ref["ChatCompletionRequest"],
            ref["ChatCompletionResponse"], "ChatCompletionStreamResponse", slo)},
        "/v1/completions": {"post": _generate(
            "create_completion", "completion", "text_completion", ref["CompletionRequest"], ref["CompletionResponse"],
            "CompletionStreamResponse", slo)},
        "/v1/responses": {"post": _operation(
            "create_response", "create a response (OpenAI's Responses API, as vLLM serves it)",
            {"description": "a response (JSON), or its events as server-sent events when `stream` is true: "
                            "`event: <type>` and `data: <event JSON>` each (response.created, ..., "
                            "response.output_text.delta per token, ..., response.completed), no [DONE]",
             "content": {"application/json": {"schema": ref["ResponsesResponse"]},
                         "text/event-stream": {"schema": {"description": "Responses API streaming events"}}}},
            GENERATE_ERRORS, tag="openai", body=ref["ResponsesRequest"], parameters=[slo])},
        "/tokenize": {"post": _operation(
            "tokenize", "token ids of a prompt (vLLM)", _json(ref["TokenizeResponse"], "the engine's answer"),
            token_errors, tag="vllm", body=tokenize, secured=tokenize_key, description=token_words)},
        "/detokenize": {"post": _operation(
            "detokenize", "text of token ids (vLLM)", _json(ref["DetokenizeResponse"], "the engine's answer"),
            token_errors, tag="vllm", body=ref["DetokenizeRequest"], secured=tokenize_key,
            description=token_words)},
        "/v1/models": {"get": _operation(
            "list_models", "list models", _json(ref["ModelList"], "the served models"), (401,), tag="openai")},
        "/v1/models/{model}": {"get": _operation(
            "retrieve_model", "retrieve a served model", _json(ref["ModelCard"], "the model"), (401, 404),
            tag="openai", parameters=[model])},
    }


def _service_paths(ref: dict[str, JSON]) -> JSON:
    """The router's own routes: health, metrics, this document, the admin views."""
    admin = "needs an admin key (401 without a key, 403 with a non-admin key)"
    return {
        "/health": {"get": _operation(
            "health", "health", _json(ref["Health"], "the router is up"), tag="ops", secured=False)},
        "/metrics": {"get": _operation(
            "metrics", "Prometheus metrics",
            {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}},
            tag="ops", secured=False,
            description="open unless the router's `metrics_auth` is `admin` (then it needs an admin key)")},
        "/openapi.json": {"get": _operation(
            "openapi", "this document", _json({"type": "object"}, "OpenAPI 3.1"), tag="ops", secured=False)},
        "/admin/replicas": {"get": _operation(
            "admin_replicas", "admin replicas", _json(ref["ReplicasView"], "the replicas"), ADMIN_ERRORS,
            tag="admin", description=admin)},
        "/admin/topology": {"get": _operation(
            "admin_topology", "admin topology", _json(ref["TopologyView"], "the topology"), ADMIN_ERRORS,
            tag="admin", description=admin + "; 404 when the router was started without one")},
        "/admin/plan": {"get": _operation(
            "admin_plan", "admin plan", _json(ref["PlanView"], "the placement plan"), ADMIN_ERRORS, tag="admin",
            description=admin + "; 404 when the router was started without one")},
        **_lora_paths(admin),
        targets.PATH: {"get": _operation(
            "admin_prometheus_targets", "Prometheus service discovery",
            _json({"type": "array", "items": ref["TargetGroup"]}, "the router and every engine as scrape targets"),
            ADMIN_ERRORS, tag="admin", description=admin + "; Prometheus' `http_sd_config` format "
            "(configs/prometheus.yml)")},
    }


def _lora_paths(admin: str) -> JSON:
    """The LoRA admin routes (`router.lora.manager.admin`)."""
    text = {"type": "string"}
    load = {"type": "object", "required": ["lora_name"], "properties": {
        "lora_name": text, "lora_path": text, "base_model": text, "replica_id": text}}
    unload = {"type": "object", "required": ["lora_name"], "properties": {"lora_name": text, "replica_id": text}}
    body = {"type": "object", "description": "what was done"}
    words = admin + "; 404 when the router has no `lora` config"
    return {
        "/admin/lora": {"get": _operation(
            "admin_lora", "LoRA adapters", _json({"type": "object", "description": "adapters, who holds which and "
                                                 "when each was last used, the last plans"}, "the adapters"),
            ADMIN_ERRORS, tag="admin", description=words)},
        "/admin/lora/load": {"post": _operation(
            "admin_lora_load", "load a LoRA adapter", _json(body, "where it is loaded"), (400, *ADMIN_ERRORS, 503),
            tag="admin", body=load, description=words + "; known from then on and loaded now (on `replica_id`, "
            "or where a request's first load would go); `base_model` may be left out where one model is served")},
        "/admin/lora/unload": {"post": _operation(
            "admin_lora_unload", "unload a LoRA adapter", _json(body, "where it was unloaded from"),
            (*ADMIN_ERRORS, 503), tag="admin", body=unload,
            description=words + "; off `replica_id`, or off every replica (then forgotten unless configured)")},
    }


def _components(schemas: dict[str, JSON], ref: dict[str, JSON]) -> JSON:
    error = {"application/json": {"schema": ref["ErrorResponse"]}}
    retry = {"Retry-After": {"description": "seconds to wait", "required": False, "schema": {"type": "string"}}}
    allow = {"Allow": {"description": "the methods the path takes", "schema": {"type": "string"}}}
    return {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "responses": {
            "Error": {"description": "an error in OpenAI's shape", "content": error},
            "Overloaded": {"description": "an error in OpenAI's shape, with Retry-After", "headers": retry,
                           "content": error},
            "MethodNotAllowed": {"description": "the path exists but not with this method; `Allow` lists those "
                                                "it takes", "headers": allow, "content": error}},
        "schemas": schemas,
    }


def document(classes: list[str], max_tokens_limit: int, tokenize_key: bool = False) -> bytes:
    """The OpenAPI document (compact JSON) of a router with these SLO classes and this limit
    (`tokenize_key`: its `tokenize_auth` is `key`)."""
    models: list[type[BaseModel]] = [
        limited(wire.ChatCompletionRequest, max_tokens_limit), limited(wire.CompletionRequest, max_tokens_limit),
        limited(wire.ResponsesRequest, max_tokens_limit), wire.ResponsesResponse,
        wire.ChatCompletionResponse, wire.CompletionResponse, wire.ChatCompletionStreamResponse,
        wire.CompletionStreamResponse, wire.TokenizeCompletionRequest, wire.TokenizeChatRequest,
        wire.TokenizeResponse, wire.DetokenizeRequest, wire.DetokenizeResponse, wire.ModelList, wire.ModelCard,
        wire.ErrorResponse, views.Health, views.ReplicasView, views.TopologyView, views.PlanView, views.TargetGroup]
    ref, schemas = _schemas(models)
    doc = {"openapi": "3.1.0", "info": {"title": "isleserve router", "version": "1", "description": _description()},
           "paths": {**_api_paths(ref, classes, tokenize_key), **_service_paths(ref)},
           "components": _components(schemas, ref)}
    return orjson.dumps(doc)
