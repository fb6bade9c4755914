"""One generation request as the router reads it: only what routing needs (model, prompts'
length and prefix, stream, the router's own token limit, the request's cost bound
(`router.cost`)), the body re-serialised for the engine with the router's fields (priority, the
default max_tokens) and without the client's (kv_transfer_params). Pure: no I/O, no clock;
everything else the engine validates, and its 4xx comes back as it is."""

from __future__ import annotations

import zlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from pools.model import Role, SLOClass
from router.cost import CostLimits, RequestCost, check, check_sequences, measure
from router.plugins.model import RouteRequest
from wire import openai as wire
from wire.errors import ApiError
from wire.fields import as_int, over_max_model_len, prompt_over_context
from wire.prompt import Prompt, read_prompts

SCAN_ABOVE_BYTES = 65_536
MAX_JSON_CONTAINERS = 262_144
"""A body over SCAN_ABOVE_BYTES with more `[` and `{` bytes than this (inside strings too: the count
is a byte count, ~1 ms for 4 MiB) is refused before it is parsed: parsing costs an allocation per
array or object (4 MiB of `[1],` is a million lists, ~300 ms of the router's event loop). A
prompt that long of plain text or code holds a few percent of brackets, far from a quarter of
a million."""
PREFIX_BLOCK_CHARS, PREFIX_BLOCKS = 64, 4
"""Prefix affinity hashes the prompt's leading full blocks (about 16 tokens each), up to 4."""


@dataclass(slots=True)
class Call:
    slo: SLOClass
    body: dict[str, Any]
    stream: bool
    route: RouteRequest
    path: str
    """The route the client called: the engine gets the same one."""
    payload: bytes
    """`body` serialised for the engine."""
    many: bool = False
    """Served whole by one replica, never split over PD: several sequences (a list of prompts,
    n > 1; one kv_transfer_params per request), or a Responses API request (vLLM's Responses API
    takes no kv_transfer_params)."""
    cost: RequestCost | None = None
    tenant: str = ""
    """Whose request it is (the key's tenant): its quota is given back when it ends."""
    prompt_key: str = ""
    """Its first prompt as `wire.prompt.Prompt.key` reads it (the prefix-cache lookup's input)."""
    lora: str = ""
    """The LoRA adapter its `model` names ("": a base model); `route.model` is the adapter's base."""
    kv_prompt_tokens: int = 0
    """Its first prompt's tokens as its engines count them, when the prefix-cache index keyed it
    (`router.kvindex`; 0: not keyed)."""


KINDS = {"/v1/chat/completions": "chat", "/v1/completions": "completion", "/v1/responses": "responses"}
"""A generation route's kind of body (`wire.prompt.read_prompts`)."""
TOKEN_KEYS = {"chat": ("max_completion_tokens", "max_tokens"), "completion": ("max_tokens",),
              "responses": ("max_output_tokens",)}
"""Where each kind of body says its max_tokens, first given wins (vLLM's order)."""


def peek(body: dict[str, Any], max_tokens_limit: int, kind: str = "") -> tuple[str, tuple[Prompt, ...], bool]:
    """Model, prompts (every shape the API accepts, read as the engine reads them) and stream;
    400 for a missing model or a token limit over the router's (in any of the fields that say
    one). `kind`: the route's (`KINDS`)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "'model' is required", param="model")
    prompts = read_prompts(body, kind)
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        limit = as_int(body.get(key))  # as the engine (vLLM's lax pydantic) reads it: 1e9 is 10**9
        if limit is not None and limit > max_tokens_limit:
            raise ApiError(400, f"'{key}' is {limit}, over this router's limit of {max_tokens_limit}", param=key)
    return model, prompts, body.get("stream") is True


def asked_tokens(body: dict[str, Any], kind: str) -> tuple[str, int | None]:
    """The field that says the request's max_tokens, and its value (None: not given, or not an
    integer the engine would take: its own 400 says so)."""
    keys = TOKEN_KEYS.get(kind, ("max_tokens",))
    for key in keys:
        if body.get(key) is not None:
            return key, as_int(body.get(key))
    return keys[-1], None


def context_tokens(body: dict[str, Any], kind: str, prompts: tuple[Prompt, ...], largest: int) -> int:
    """The context one sequence needs (`RouteRequest.context_tokens`): its longest prompt and
    max_tokens, at most `largest` (the model's largest context, 0: not known). Where even the
    largest context cannot serve it, 400 as vLLM refuses it there (max_tokens over the context,
    but the Responses API's, which vLLM cuts to fit; then a prompt over it): no replica of the
    model could."""
    key, asked = asked_tokens(body, kind)
    longest = max(p.tokens for p in prompts)
    if largest > 0 and asked is not None and asked > largest and kind != "responses":  # that one is cut to fit
        raise over_max_model_len(key, asked, largest)
    if largest > 0 and longest > largest:
        raise prompt_over_context(longest, largest)
    need = longest + max(asked or 0, 0)
    return min(need, largest) if largest > 0 else need


def read_call(raw: bytes, path: str, slo: SLOClass, *, max_body_bytes: int, max_tokens_limit: int,
              mixed: Collection[str], limits: CostLimits | None = None, seq_share: float = 1.0,
              declared: Collection[tuple[str, str]] = (), tenant: str = "",
              contexts: Mapping[str, int] | None = None, largest: Mapping[str, int] | None = None,
              adapters: Mapping[str, str] | None = None) -> Call:
    """The request `raw` (a body sent to `path`) as the router routes it. `mixed`: the models
    that have mixed replicas (several sequences go to a decode replica where a model has none).
    `limits`: the cost bound (400 past it; None: none); `seq_share`: the class's share of a
    replica's sequence slots; `declared`: the (model, class) pairs the routing table has pools
    declared for, `"*"` for a pool open to every class (none for the class: any pool serves it);
    `contexts`: each model's max_model_len as its engines said (the default max_tokens stays
    within it: vLLM refuses a max_tokens above it); `largest`: each model's largest one (what a
    request may need at most, `context_tokens`); `adapters`: LoRA adapter -> its base model (a
    request naming one is routed as its base model's, served whole by one replica: `router.lora`)."""
    if len(raw) > max_body_bytes:
        raise ApiError(413, f"request body over {max_body_bytes} bytes")
    if len(raw) > SCAN_ABOVE_BYTES and raw.count(b"[") + raw.count(b"{") > MAX_JSON_CONTAINERS:
        raise ApiError(400, f"request body holds over {MAX_JSON_CONTAINERS} JSON arrays and objects")
    body = wire.load_body(raw)
    if limits is not None:
        check_sequences(body, limits)  # before a prompt is read: a million-entry list costs seconds to read
    kind = KINDS.get(path, "")
    model, prompts, stream = peek(body, max_tokens_limit, kind)
    lora = model if adapters and model in adapters else ""
    if lora:  # the body keeps the adapter's name: the engine serves it
        model = (adapters or {})[lora]
    cost = None
    if limits is not None:
        default = min(limits.default_max_tokens, max_tokens_limit, (contexts or {}).get(model, max_tokens_limit))
        cost = measure(body, prompts, chat=kind != "completion", stream=stream, default_max_tokens=default,
                       token_keys=TOKEN_KEYS.get(kind))
        check(cost, limits)
    # before the default below: a request that asks no max_tokens takes what its replica's context leaves
    need = context_tokens(body, kind, prompts, (largest or {}).get(model, 0))
    if cost is not None and cost.defaulted:  # the engine would go on to the model's context: the router's instead
        body[TOKEN_KEYS.get(kind, ("max_tokens",))[-1]] = cost.max_tokens
    # PD handover parameters are the router's business: a client cannot steer KV transfers
    body.pop("kv_transfer_params", None)
    body["priority"] = slo.priority  # vLLM's priority scheduling: lower is earlier
    try:
        payload = orjson.dumps(body)
    except orjson.JSONEncodeError:  # parses, but nests deeper than it can be written again
        raise ApiError(400, "request body nests too deeply (JSON deeper than 254 levels cannot be "
                                 "forwarded)") from None
    key = prompts[0].key  # the prefix a replica's cache may hold: the first prompt's
    blocks = min(len(key) // PREFIX_BLOCK_CHARS, PREFIX_BLOCKS)
    prefix = key[: blocks * PREFIX_BLOCK_CHARS]
    tokens = sum(p.tokens for p in prompts)
    n = as_int(body.get("n"))  # 2.0 and "2" are two sequences to the engine, too
    many = len(prompts) > 1 or (n is not None and n > 1) or kind == "responses" or bool(lora)
    # several sequences in one request (prompt lists, n > 1): served whole, never split over PD
    # (one kv_transfer_params per request); by a decode replica where the model has no mixed one
    role: Role | None = "decode" if many and model not in mixed else None
    seqs = cost.sequences if cost is not None else len(prompts) * max(n or 1, 1)
    any_pool = (model, slo.name) not in declared and (model, "*") not in declared
    route = RouteRequest(model, slo, tokens, zlib.crc32(prefix.encode()) if prefix else 0, role, seqs, any_pool,
                         seq_share, need)
    return Call(slo=slo, body=body, stream=stream, route=route, path=path, payload=payload, many=many, cost=cost,
                lora=lora,
                tenant=tenant, prompt_key=key)
