"""PD orchestration by vLLM's disaggregated-serving protocol: whether a request is split, the
prefill leg (`max_tokens: 1`, `kv_transfer_params: {do_remote_decode: true}`), the decode leg
with what the prefill returned (a flight like any other: retried on another decode before the
first byte), and releasing KV a prefill holds when no decode will claim it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import TYPE_CHECKING, Any

import orjson

from pools.wire import openai as wire
from pools.wire.http import Responder
from router import relay
from router.decision import Candidate, PDDecision, pd_decide
from router.flight import JSON_HEADERS, Flight
from router.upstream import UpstreamError

if TYPE_CHECKING:
    from router.server import Router, _Call


def pd_choice(router: Router, call: _Call, snapshot: list[Candidate]) -> PDDecision | None:
    """The prefill/decode pair for this request, or None: a mixed replica serves it whole."""
    pd = router.config.pd
    if not pd.enabled or call.many:
        return None
    return pd_decide(call.route, snapshot, router.topology, min_prompt_tokens=pd.min_prompt_tokens,
                     has_mixed=call.route.model in router.replicas.mixed)


async def _release_prefill(router: Router, pcand: Candidate, request_id: Any, engine_id: Any = None) -> None:
    """Tell the prefill engine that nobody will claim the KV it holds (or will hold) for the request.
    The simulated engine frees it (and, for an id it does not hold yet, frees it when the prefill
    ends); vLLM has no such route (404, ignored): it frees KV of an aborted request at once, and
    KV that a finished prefill holds unclaimed after VLLM_NIXL_ABORT_REQUEST_TIMEOUT."""
    body = orjson.dumps({"request_id": request_id, "engine_id": engine_id})
    with contextlib.suppress(UpstreamError, OSError, asyncio.CancelledError):
        ex = await relay.start(router.relay, pcand.endpoint.url, "/internal/kv/release", body, JSON_HEADERS, 2.0)
        await relay.finish(ex, 2.0)


async def _prefill(router: Router, call: _Call, pcand: Candidate, request_id: str) -> tuple[int, bytes]:
    first = {**call.body, "max_tokens": 1, "stream": False, "kv_transfer_params": {"do_remote_decode": True},
             "request_id": request_id}
    for key in ("stream_options", "max_completion_tokens", "min_tokens"):  # one token, not streamed
        first.pop(key, None)
    rid = pcand.endpoint.replica_id
    router.replicas.opened(rid)
    t0 = time.perf_counter()
    try:
        ex = await relay.start(router.relay, pcand.endpoint.url, call.path, orjson.dumps(first), JSON_HEADERS,
                               router.config.upstream.request_timeout_s)
        try:
            await relay.finish(ex, router.config.upstream.idle_timeout_s)
        finally:
            ex.abort()
    except UpstreamError as err:
        router.replicas.failed(rid, pcand.endpoint.url)
        raise wire.ApiError(502, f"upstream failed: {err}", "bad_gateway") from None
    finally:
        router.replicas.closed(rid)
    if ex.status >= 500:
        router.replicas.failed(rid, pcand.endpoint.url)
        raise wire.ApiError(502, f"upstream failed: {rid} answered {ex.status}", "bad_gateway")
    router.replicas.ok(rid, (time.perf_counter() - t0) * 1000)
    return ex.status, ex.body()


async def serve_pd(router: Router, call: _Call, pd: PDDecision, response: Responder, started: float) -> str:
    """vLLM's disaggregated-serving protocol: prefill with kv_transfer_params and max_tokens=1,
    then decode with what the prefill returned, streamed back."""
    pcand = pd.prefill
    request_id = router.request_id()
    try:
        status, raw = await _prefill(router, call, pcand, request_id)
    except BaseException:
        # the client left (cancelled) or the prefill failed: it may have finished all the same and
        # hold the KV; the release goes apart from this request, which may be cancelled
        router.spawn(_release_prefill(router, pcand, request_id))
        raise
    if status != 200:
        response.send(status, raw)
        router.metrics.child(router.metrics.rejections, call.slo.name, f"engine_{status}").inc()
        return "rejected"
    try:
        params = json.loads(raw)["kv_transfer_params"]
        if not isinstance(params, dict):
            raise TypeError("kv_transfer_params is not an object")
    except (ValueError, KeyError, TypeError):
        router.spawn(_release_prefill(router, pcand, request_id))
        raise wire.ApiError(502, f"prefill replica {pcand.endpoint.replica_id} returned no kv_transfer_params",
                            "bad_gateway") from None
    handover = time.perf_counter()
    second = orjson.dumps({**call.body, "kv_transfer_params": params})
    try:
        flight = await router.fly(Flight, call, list(pd.decode_order) or [pd.decode], response, started, second,
                                 extra=(("x-isle-prefill-replica", pcand.endpoint.replica_id),), tiers=pd.tiers)
        outcome = flight.outcome_or_raise()
    except BaseException:
        # nobody will claim the held KV now (the decode failed, or the client left)
        router.spawn(_release_prefill(router, pcand, params.get("remote_request_id"), params.get("remote_engine_id")))
        raise
    kv_s = pd.kv_ms / 1000 if pd.kv_ms else max(0.0, flight.head_at - handover)
    router.metrics.child(router.metrics.kv, *flight.labels).observe(kv_s)
    return outcome
