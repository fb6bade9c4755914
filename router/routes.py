"""The router's routes beside generation: which methods each path takes (a known path asked
with another method is 405 with `Allow`, as RFC 9110 §15.5.6 wants, not 404), the model a
client retrieves (`GET /v1/models/{id}`, answered from the routing table as OpenAI's retrieve
model does), and vLLM's `/tokenize` and `/detokenize`, proxied to a replica serving the model
(`vllm bench serve` asks them; the answer is that engine's own tokenizer's); the admin views,
the OpenAPI document as this router serves it, and errors as the client gets them."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any
from urllib.parse import unquote

from router import openapi, relay, targets
from router.flight import FlightContext
from router.quota import Bucket
from router.state import Replicas
from router.upstream import UpstreamError
from topology import Topology
from wire import openai as wire
from wire.errors import ApiError
from wire.reader import Request
from wire.responder import Responder

GET, POST = ("GET", "HEAD"), ("POST",)
ROUTES: dict[str, tuple[str, ...]] = {
    "/v1/chat/completions": POST, "/v1/completions": POST, "/v1/responses": POST, "/tokenize": POST,
    "/detokenize": POST,
    "/v1/models": GET, "/health": GET, "/metrics": GET, "/openapi.json": GET,
    "/admin/replicas": GET, "/admin/topology": GET, "/admin/plan": GET, targets.PATH: GET,
    "/admin/lora": GET, "/admin/lora/load": POST, "/admin/lora/unload": POST}
MODELS_PREFIX = "/v1/models/"
TOKEN_PATHS = frozenset({"/tokenize", "/detokenize"})
PROXY_TIMEOUT_S = 30.0
REFUSALS = {400: "bad_request", 401: "unauthenticated", 403: "forbidden", 404: "not_found", 413: "too_large",
            429: "rate_limited"}
"""The cause a refusal is counted under when the error does not name one."""


def allowed(path: str) -> tuple[str, ...] | None:
    """The methods `path` takes, or None for a path the router does not have."""
    found = ROUTES.get(path)
    if found is None and path.startswith(MODELS_PREFIX) and len(path) > len(MODELS_PREFIX):
        return GET
    return found


def wrong_method(method: str, path: str) -> ApiError | None:
    """405 for a known path asked with a method it does not take (None: the method is right, or
    the path is unknown)."""
    methods = allowed(path)
    if methods is None or method in methods:
        return None
    return ApiError(405, f"method {method} not allowed on {path} (allowed: {', '.join(methods)})",
                         "method_not_allowed", cause="method_not_allowed", headers=(("allow", ", ".join(methods)),))


def controller_health(plan: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """The controller's health as the plan it published last says it (control.state.alarms:
    `status`, `reasons`, `alerts`, `write_failures`); empty when there is no controller (a
    standalone router) or it does not say."""
    found = ((plan or {}).get("controller") or {}).get("health")
    return found if isinstance(found, Mapping) else {}


def health_body(replicas: int, plan: Mapping[str, Any] | None, health: Mapping[str, Any] | None = None) -> bytes:
    """`/health`: "ok", or "degraded" with the controller's reasons (a full disk: its state is not
    saved; a controller that does not answer, router.contact). Always HTTP 200: the data plane
    serves either way; a probe that restarts the router on anything but 200 must not make a
    controller's problem an outage. `health`: the controller's health when the caller knows more
    than the plan says (default: the plan's)."""
    health = controller_health(plan) if health is None else health
    reasons = [str(r) for r in health.get("reasons", ())]
    return json.dumps({"status": "degraded" if reasons else "ok", "replicas": replicas,
                       **({"reasons": reasons} if reasons else {})}).encode()


def model_body(models: Collection[str], path: str, contexts: Mapping[str, int] | None = None) -> bytes:
    """`GET /v1/models/{id}`: the model as OpenAI's retrieve answers it (with its largest
    `max_model_len` once an engine said it, as `/v1/models`), or 404."""
    model = unquote(path[len(MODELS_PREFIX):])
    if model not in models:
        raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
    card: dict[str, Any] = {"id": model, "object": "model", "created": 0, "owned_by": "isleserve"}
    if (contexts or {}).get(model):
        card["max_model_len"] = (contexts or {})[model]
    return json.dumps(card).encode()


class KeylessBudget:
    """The request bytes per second open token routes take from callers without a key: a
    `router.quota.Bucket` holding `burst_s` seconds of it that requests queue on; `wait` says how
    long a request of `n` bytes waits, None when longer than `max_wait_s` (then it is refused)."""

    def __init__(self, bytes_per_s: float, burst_s: float = 4.0, max_wait_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.clock, self.max_wait_s = clock, max_wait_s
        self.bucket = Bucket(bytes_per_s, bytes_per_s * burst_s, clock()) if bytes_per_s > 0 else None

    def wait(self, n: int) -> float | None:
        if self.bucket is None:
            return 0.0
        return self.bucket.reserve(float(n), self.clock(), self.max_wait_s)


async def forward(ctx: FlightContext, request: Request, response: Responder,
                  budget: KeylessBudget | None = None) -> None:
    """`/tokenize` or `/detokenize` to the healthiest replicas of the body's model, in turn
    (another on a connect error, timeout or 5xx); the engine's answer goes back as it is."""
    try:
        if budget is not None:
            delay = budget.wait(len(request.body))
            if delay is None:
                raise ApiError(429, "too many requests to the open token routes without a key: retry later, "
                                    "or send an API key", "RateLimitError", cause="keyless_tokenize",
                               headers=(("retry-after", "1"),))
            if delay > 0:
                await asyncio.sleep(delay)
        await _forward(ctx, request, response)
    except ApiError as err:
        send_error(response, err)


async def _forward(ctx: FlightContext, request: Request, response: Responder) -> None:
    body = wire.load_body(request.body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "'model' is required", param="model")
    if model not in ctx.replicas.served:
        raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
    order = sorted((c for c in ctx.replicas.snapshot() if c.endpoint.model == model and c.endpoint.healthy
                    and not c.load.breaker_open), key=lambda c: (c.endpoint.role != "mixed", c.load.inflight))
    last = "no healthy replica of the model"
    for cand in order[: ctx.upstream.retries + 1]:
        url, rid = cand.endpoint.url, cand.endpoint.replica_id
        t0 = ctx.clock()
        try:
            ex = await relay.start(ctx.relay, url, request.path, request.body, ctx.relay.headers, PROXY_TIMEOUT_S)
            try:
                await relay.finish(ex, PROXY_TIMEOUT_S)
            finally:
                ex.abort()
        except UpstreamError as err:
            ctx.replicas.failed(rid, url)
            last = f"{rid}: {err}"
            continue
        if ex.status >= 500:
            last = f"{rid} answered {ex.status}"
            continue
        ctx.replicas.ok(rid, (ctx.clock() - t0) * 1000)
        response.send(ex.status, ex.body(), ex.content_type, headers=[("x-isle-replica", rid)])
        return
    raise ApiError(502 if order else 503, f"upstream failed: {last}", "bad_gateway" if order else
                        "service_unavailable")


def admin_view(path: str, replicas: Replicas, worker: int, topology: Topology | None,
               plan: Mapping[str, Any] | None, caches: Mapping[str, Mapping[str, Any]] | None = None) -> Any:
    """What the admin routes (admin key) answer: the replicas as this worker (`worker`) sees
    them (with `caches`, the router's KV index: each replica's `prefix_cache`), the topology,
    the plan."""
    if path == "/admin/replicas":
        now = time.monotonic()  # the breakers' clock (router.state)
        return {"version": replicas.table.version, "worker": worker, "replicas": [
            {"replica_id": s.endpoint.replica_id, "url": s.endpoint.url, "model": s.endpoint.model,
             "pool": s.endpoint.pool, "role": s.endpoint.role, "node": s.endpoint.node,
             "gpus": list(s.endpoint.gpus), "tier": s.endpoint.tier, "healthy": s.endpoint.healthy,
             "draining": s.endpoint.draining, "breaker_open": now < s.open_until, "running": s.running,
             "waiting": s.waiting, "kv_usage": s.kv_usage, "inflight": s.inflight,
             "latency_ms": round(s.latency_ms, 3),
             **({"prefix_cache": caches.get(s.endpoint.replica_id)} if caches is not None else {})}
            for s in replicas.states.values()],
            **({"kv_paths": replicas.kv_watch.view(now)} if replicas.kv_watch is not None else {})}
    if path == "/admin/topology":
        if topology is None:
            raise ApiError(404, "this router was started without a topology", "not_found_error")
        from topology.serialize import to_dict

        return to_dict(topology)
    if path == "/admin/plan":
        if plan is None:
            raise ApiError(404, "this router was started without a placement plan", "not_found_error")
        return plan
    raise ApiError(404, f"no admin route {path}", "not_found_error")


def served_document(classes: list[str], max_tokens_limit: int, tokenize_key: bool = False) -> bytes:
    """The OpenAPI document this router serves at `/openapi.json`, generated from the pydantic
    models (`router.openapi`): its SLO class names as the `x-slo-class` values, its
    `max_tokens_limit` as the most tokens a request may ask, whether /tokenize wants a key."""
    return openapi.document(classes, max_tokens_limit, tokenize_key)


class ServedDocument:
    """`/openapi.json` as the router serves it now: the most tokens a request may ask is the
    router's `max_tokens_limit`, or less once the engines said their contexts and the largest is
    smaller (the router refuses more, as vLLM: `router.call.context_tokens`). Built again only
    when that bound changes."""

    def __init__(self, classes: list[str], max_tokens_limit: int, tokenize_key: bool = False) -> None:
        self.classes, self.max_tokens_limit, self.tokenize_key = classes, max_tokens_limit, tokenize_key
        self._built: tuple[int, bytes] | None = None

    def bound(self, contexts: Mapping[str, int]) -> int:
        largest = max(contexts.values(), default=0)
        return min(self.max_tokens_limit, largest) if largest > 0 else self.max_tokens_limit

    def document(self, contexts: Mapping[str, int]) -> bytes:
        bound = self.bound(contexts)
        if self._built is None or self._built[0] != bound:
            self._built = (bound, served_document(self.classes, bound, self.tokenize_key))
        return self._built[1]


def send_error(response: Responder, err: ApiError) -> None:
    """`err` as the client gets it (unless the response has begun), with its headers and
    Retry-After for 429 and 503."""
    if not response.started:
        timed = err.status in (429, 503) and not any(k == "retry-after" for k, _ in err.headers)
        headers = [*err.headers, *((("retry-after", "1"),) if timed else ())]
        response.send(err.status, err.body(), headers=headers)
