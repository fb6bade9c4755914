"""PD orchestration by vLLM's disaggregated-serving protocol: whether a request is split, the
prefill leg (`max_tokens: 1`, `kv_transfer_params: {do_remote_decode: true}`), the decode leg
with what the prefill returned (a flight like any other: retried on another decode before the
first byte), and releasing KV a prefill holds when no decode will claim it. It works through
the flight's context (router.flight.FlightContext) and what the caller hands it (the request id,
a way to run clean-up apart from the request); it never sees the `Router`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Collection, Coroutine
from typing import Any

import orjson

from pools.model import Role
from router import relay
from router.call import Call
from router.config import PDConfig
from router.flight import FlightContext, fly
from router.kvwatch import KvWatch
from router.plugins.model import Candidate
from router.plugins.pd import PDDecision, pd_decide
from router.plugins.timing import PluginTimer
from router.relay import RelayPool
from router.upstream import UpstreamError
from topology import Topology
from wire.errors import ApiError
from wire.responder import Responder

Spawn = Callable[[Coroutine[Any, Any, None]], None]
"""Runs clean-up apart from the request that needed it (which may be cancelled)."""
RELEASE_TIMEOUT_S = 2.0


def pd_choice(pd: PDConfig, call: Call, snapshot: list[Candidate], topology: Topology | None,
              mixed: Collection[str], timer: PluginTimer | None = None,
              timed: Callable[[float], None] | None = None, clock: Callable[[], float] = time.perf_counter,
              watch: KvWatch | None = None) -> PDDecision | None:
    """The prefill/decode pair for this request, or None: a mixed replica serves it whole.
    `mixed`: the models with mixed replicas in the routing table. `timed` gets the seconds
    the choice took, for every request PD weighed (`isle_router_decision_seconds{kind="pd"}`).
    `watch`: the pairs' measured KV transfers, priced in place of the cost model's, and told
    which pair was chosen (an avoided pair's probe)."""
    if not pd.enabled or call.many:
        return None
    t0 = clock()
    out = pd_decide(call.route, snapshot, topology, min_prompt_tokens=pd.min_prompt_tokens,
                    has_mixed=call.route.model in mixed, timer=timer,
                    measured=watch.costs(time.monotonic()) if watch is not None and watch.pairs else None)
    if timed is not None:
        timed(clock() - t0)
    if watch is not None and out is not None:
        watch.chosen((out.prefill.endpoint.replica_id, out.decode.endpoint.replica_id))
    return out


def holding_roles(pd: PDConfig, call: Call, mixed: Collection[str]) -> tuple[Role, ...]:
    """The roles of the replicas that would hold this request's sequences: the role it asks for
    (several sequences: decode where the model has no mixed replica), else mixed, a decode too
    when the request may split over PD."""
    role = call.route.role
    if role is not None:
        return (role,)
    if call.route.model not in mixed:
        return ("decode",)
    may_split = pd.enabled and not call.many and call.route.prompt_tokens >= pd.min_prompt_tokens
    return ("mixed", "decode") if may_split else ("mixed",)


async def _release_prefill(pool: RelayPool, pcand: Candidate, request_id: Any, engine_id: Any = None) -> None:
    """Tell the prefill engine that nobody will claim the KV it holds (or will hold) for the request.
    The simulated engine frees it (and, for an id it does not hold yet, frees it when the prefill
    ends); vLLM has no such route (404, ignored): it frees KV of an aborted request at once, and
    KV that a finished prefill holds unclaimed after VLLM_NIXL_ABORT_REQUEST_TIMEOUT."""
    body = orjson.dumps({"request_id": request_id, "engine_id": engine_id})
    with contextlib.suppress(UpstreamError, OSError, asyncio.CancelledError):
        ex = await relay.start(pool, pcand.endpoint.url, "/internal/kv/release", body, pool.headers,
                               RELEASE_TIMEOUT_S)
        await relay.finish(ex, RELEASE_TIMEOUT_S)


async def _prefill(ctx: FlightContext, call: Call, pcand: Candidate, request_id: str) -> tuple[int, bytes]:
    first = {**call.body, "max_tokens": 1, "stream": False, "kv_transfer_params": {"do_remote_decode": True},
             "request_id": request_id}
    for key in ("stream_options", "max_completion_tokens", "min_tokens"):  # one token, not streamed
        first.pop(key, None)
    rid = pcand.endpoint.replica_id
    ctx.replicas.opened(rid)
    ctx.metrics.child(ctx.metrics.sent, pcand.endpoint.pool).inc()
    ctx.metrics.child(ctx.metrics.replica_sent, rid).inc()
    t0 = ctx.clock()
    try:
        ex = await relay.start(ctx.relay, pcand.endpoint.url, call.path, orjson.dumps(first), ctx.relay.headers,
                               ctx.upstream.request_timeout_s)
        try:
            await relay.finish(ex, ctx.upstream.idle_timeout_s)
        finally:
            ex.abort()
    except UpstreamError as err:
        ctx.replicas.failed(rid, pcand.endpoint.url)
        raise ApiError(502, f"upstream failed: {err}", "bad_gateway") from None
    finally:
        ctx.replicas.closed(rid)
    if ex.status >= 500:
        ctx.replicas.failed(rid, pcand.endpoint.url)
        raise ApiError(502, f"upstream failed: {rid} answered {ex.status}", "bad_gateway")
    ctx.replicas.ok(rid, (ctx.clock() - t0) * 1000)
    return ex.status, ex.body()


async def serve_pd(ctx: FlightContext, call: Call, pd: PDDecision, response: Responder, started: float,
                   request_id: str, spawn: Spawn) -> str:
    """vLLM's disaggregated-serving protocol: prefill with kv_transfer_params and max_tokens=1
    (as `request_id`), then decode with what the prefill returned, streamed back."""
    pcand = pd.prefill
    try:
        status, raw = await _prefill(ctx, call, pcand, request_id)
    except BaseException:
        # the client left (cancelled) or the prefill failed: it may have finished all the same and
        # hold the KV; the release goes apart from this request, which may be cancelled
        spawn(_release_prefill(ctx.relay, pcand, request_id))
        raise
    if status != 200:
        response.send(status, raw)
        ctx.metrics.child(ctx.metrics.rejections, call.slo.name, f"engine_{status}").inc()
        return "rejected"
    try:
        params = json.loads(raw)["kv_transfer_params"]
        if not isinstance(params, dict):
            raise TypeError("kv_transfer_params is not an object")
    except (ValueError, KeyError, TypeError):
        spawn(_release_prefill(ctx.relay, pcand, request_id))
        raise ApiError(502, f"prefill replica {pcand.endpoint.replica_id} returned no kv_transfer_params",
                            "bad_gateway") from None
    handover = ctx.clock()
    second = orjson.dumps({**call.body, "kv_transfer_params": params})
    try:
        flight = await fly(ctx, call, list(pd.decode_order) or [pd.decode], response, started, second,
                           extra=(("x-isle-prefill-replica", pcand.endpoint.replica_id),), tiers=pd.tiers)
        outcome = flight.outcome_or_raise()
    except BaseException:
        # nobody will claim the held KV now (the decode failed, or the client left)
        spawn(_release_prefill(ctx.relay, pcand, params.get("remote_request_id"), params.get("remote_engine_id")))
        raise
    kv_s = pd.kv_ms / 1000 if pd.kv_ms else max(0.0, flight.head_at - handover)
    ctx.metrics.child(ctx.metrics.kv, *flight.labels).observe(kv_s)
    if flight.cand is not None:  # a whole answer's first byte comes after every token: fed, not timed
        _measured(ctx, pd, flight.cand, flight.labels[2], flight.head_at - handover if call.stream else None)
    return outcome


def _measured(ctx: FlightContext, pd: PDDecision, decode: Candidate, tier: str, handover_s: float | None) -> None:
    """The router's view of the handover (streamed requests): prefill done -> the decode's first
    token, less the decode's predicted first step, for the pair (`router.kvwatch`, `isle_kv_transfer_seconds`)."""
    watch = ctx.replicas.kv_watch
    expected, latency_ms, step_ms = pd.rates.get(decode.endpoint.replica_id, (0.0, 0.0, 0.0))
    if watch is None or not expected:
        return  # no transfer (one GPU group), or the decode was not priced
    transfer_ms = None if handover_s is None else max(0.0, handover_s * 1000 - step_ms)
    pair = (pd.prefill.endpoint.replica_id, decode.endpoint.replica_id)
    followed = watch.handover(pair, tier=tier, expected_ms_per_byte=expected, latency_ms=latency_ms,
                              decode_tp=decode.endpoint.tp, kv_bytes=pd.kv_bytes, transfer_ms=transfer_ms,
                              now=time.monotonic())
    if transfer_ms is None:
        return
    label = f"{pair[0]}->{pair[1]}" if followed else "other"
    ctx.metrics.child(ctx.metrics.kv_pair, tier, label).observe(transfer_ms / 1000)
