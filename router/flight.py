"""One proxied generation request, driven by the upstream connection's callbacks: try the
ranked replicas in order until one answers (connect errors, timeouts and 5xx before the first
byte go to the next — never after, so no token reaches the client twice), then relay the body
verbatim (SSE chunks as they come, with back-pressure) and record per-tier latency.

No task, future or await per request: this is what keeps the router's CPU per request small.
A coroutine that needs the outcome (the decode leg of a PD request) awaits `fly`.

One whose every replica refused the connection (`Flight.reached` False) goes back to the router
to wait for its next table (`FlightContext.reroute`): no engine saw it.

A flight sees the router only through its `FlightContext`: the replica table (to pick up and
put down load, and to count failures for the breakers), the relay, the metrics, the deadline
watch, the upstream settings, the clock and the callback that ends a request. It never sees the
`Router`, and nothing here imports the server.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

from router.call import Call
from router.config import UpstreamConfig
from router.metrics import HistogramSeries, RouterMetrics
from router.plugins.model import Candidate
from router.relay import RelayPool, UpstreamProtocol, request_bytes
from router.state import Replicas
from router.timing import TAIL, reported_timing, token_events
from router.upstream import Unreachable, UpstreamError
from wire import openai as wire
from wire.errors import ApiError
from wire.responder import Responder

log = logging.getLogger("isleserve.router")
Ended = tuple[str, "ApiError | None"]
_UNSET = HistogramSeries(())
Clock = Callable[[], float]
"""Seconds on a monotonic clock (time.perf_counter in the router; a test may pass its own)."""
SERVED_BY_KEEP = 4096


class FlightContext:
    """What a flight needs of the router: the replica table, the relay, the metrics, the upstream
    settings, the clock, the deadline watch, `ended(call, outcome)`, called once when a flight
    that owns its request's admission slot ends, and `reroute(call, response, started, error)`,
    offered a request no engine saw with the 502 it would get: True when the router took it over,
    slot and answer (`router.generation.Generation._reroute`); None or False: the 502 now."""

    __slots__ = ("_served_by", "clock", "ended", "metrics", "relay", "replicas", "reroute", "upstream", "watch")

    def __init__(self, replicas: Replicas, relay: RelayPool, metrics: RouterMetrics, upstream: UpstreamConfig,
                 ended: Callable[[Call, str], None], clock: Clock = time.perf_counter,
                 reroute: Callable[[Call, Responder, float, ApiError], bool] | None = None) -> None:
        self.replicas, self.relay, self.metrics, self.upstream = replicas, relay, metrics, upstream
        self.ended, self.clock, self.reroute = ended, clock, reroute
        self.watch = Watch(clock)
        self._served_by: dict[tuple[str, str, tuple[tuple[str, str], ...]], bytes] = {}

    def served_by(self, cand: Candidate, tier: str, extra: tuple[tuple[str, str], ...]) -> bytes:
        """The response headers that say what served a request (cached: a handful of combinations)."""
        key = (cand.endpoint.replica_id, tier, extra)
        found = self._served_by.get(key)
        if found is None:
            found = self._served_by[key] = b"".join(
                f"{k}: {v}\r\n".encode("latin-1")
                for k, v in (("x-isle-replica", cand.endpoint.replica_id), ("x-isle-tier", tier), *extra))
            if len(self._served_by) > SERVED_BY_KEEP:
                self._served_by.clear()
        return found


class Flight:
    __slots__ = ("abandoned", "bad", "call", "cand", "chunks", "conn", "content_type", "ctx", "deadline", "ended",
                 "error", "extra", "first", "head_at", "itl", "labels", "last", "last_data", "order", "out",
                 "outcome", "owner", "parts", "paused_at", "payload", "prev", "reached", "response", "sent_at",
                 "started", "status", "streaming", "tail", "tiers", "tokens", "tried", "waiter")

    def __init__(self, ctx: FlightContext, call: Call, order: list[Candidate], response: Responder, started: float,
                 payload: bytes, *, extra: tuple[tuple[str, str], ...] = (), tiers: Mapping[str, str] | None = None,
                 waiter: asyncio.Future[Ended] | None = None, owner: bool = False) -> None:
        """`owner`: this flight holds the request's admission slot and counts its outcome (the
        callback path); otherwise the coroutine awaiting `waiter` does."""
        self.ctx, self.call, self.order, self.response = ctx, call, order, response
        self.started, self.payload, self.extra, self.tiers = started, payload, extra, tiers
        self.waiter, self.owner = waiter, owner
        self.conn: UpstreamProtocol | None = None
        self.abandoned = False
        self.tried = 0
        self.reached = False  # a connection to an engine was made: it may have seen the request
        self.cand: Candidate | None = None
        self.labels: tuple[str, str, str] = ("", "", "")
        self.status = 0
        self.content_type = ""
        self.parts: list[bytes] = []
        self.out: list[bytes] = []
        """Framed bytes for the client, gathered during one read from the engine (`flush`)."""
        self.streaming = False
        self.bad = ""
        self.last = "no replica tried"
        self.sent_at = self.deadline = self.last_data = 0.0
        self.paused_at = 0.0
        """When the router stopped reading the engine because the client was slow (0: reading)."""
        self.chunks = 0
        self.tokens = 0
        """Output chunks seen (token_events): ITL is observed per gap between them."""
        self.tail = b""
        self.first = self.prev = 0.0
        self.ended = False
        self.head_at = 0.0
        self.itl = _UNSET  # the series of this class, pool and tier, from the first chunk on
        self.outcome = ""
        self.error: ApiError | None = None

    # trying replicas
    def begin(self) -> None:
        if not self.order:
            self._fail(ApiError(503, "no healthy replica can serve this request now", "service_unavailable"))
            return
        self._next()

    def _next(self) -> None:
        r = self.ctx
        if self.tried >= len(self.order) or self.tried > r.upstream.retries:
            error = ApiError(502, f"upstream failed: {self.last}", "bad_gateway")
            if not self.reached and self.owner and r.reroute is not None and r.reroute(self.call, self.response,
                                                                                      self.started, error):
                self._handed_over()
                return
            self._fail(error)
            return
        cand = self.cand = self.order[self.tried]
        self.tried += 1
        r.replicas.opened(cand.endpoint.replica_id, self.call.route.seqs)
        r.metrics.child(r.metrics.sent, cand.endpoint.pool).inc()
        r.metrics.child(r.metrics.replica_sent, cand.endpoint.replica_id).inc()
        self.status, self.bad, self.parts, self.streaming = 0, "", [], False
        up = r.upstream
        # an engine answers a non-stream request only when it is done: wait for the whole of it
        wait_s = up.first_byte_timeout_s if self.call.stream else up.request_timeout_s
        self.sent_at = r.clock()
        self.deadline = r.watch.add(self, wait_s)
        r.relay.send(cand.endpoint.url, request_bytes(cand.endpoint.url, "POST", self.call.path, self.payload,
                                                      r.relay.headers), self)

    def _retry(self, reason: str) -> None:
        assert self.cand is not None
        self.last = reason
        self.ctx.replicas.failed(self.cand.endpoint.replica_id, self.cand.endpoint.url)
        self.ctx.replicas.closed(self.cand.endpoint.replica_id, self.call.route.seqs)
        self.cand = None
        self._next()

    # deadlines: the router's watch sweeps every flight a few times a second (no timer per request)
    def check(self, now: float) -> None:
        """The engine's deadlines: a stream's first token within `first_byte_timeout_s` of the
        request (an engine answers a stream's head before the request leaves its queue, so the
        head does not count), a non-streamed answer within `request_timeout_s`; then no gap longer
        than `idle_timeout_s`. While the router holds the engine back for a slow client, the
        engine is not late: the client's own write timeout (wire.limits) covers that."""
        if self.ended or self.paused_at:
            return
        flowing = self.tokens > 0 or (self.status > 0 and not self.streaming)
        due = self.last_data + self.ctx.upstream.idle_timeout_s if flowing else self.deadline
        if now < due:
            return
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.abort()
        self.reached = True  # the engine may hold the request
        key = self.cand.endpoint.url.removeprefix("http://") if self.cand else "upstream"
        if flowing:
            self.on_error(UpstreamError("upstream went quiet mid-response"))
        elif self.response.started:  # a chunk without output went out (a role chunk): no retry now
            self.on_error(UpstreamError(f"no token from {key} in time"))
        else:
            self._retry(f"no {'first token' if self.call.stream else 'response'} from {key} in time")

    # relay.Listener
    def on_head(self, status: int, content_type: str) -> None:
        cand = self.cand
        assert cand is not None
        self.status, self.content_type = status, content_type
        self.reached = True
        r = self.ctx
        self.last_data = r.clock()
        if status >= 500:
            self.bad = f"{cand.endpoint.replica_id} answered {status}"
            return  # read the error body to keep the connection, then try the next replica
        self.head_at = self.last_data
        r.replicas.ok(cand.endpoint.replica_id, (self.head_at - self.sent_at) * 1000)
        tier = self.tiers.get(cand.endpoint.replica_id, cand.endpoint.tier) if self.tiers else cand.endpoint.tier
        self.labels = (self.call.slo.name, cand.endpoint.pool, tier)
        # The client's head waits for the first chunk: an engine answers a stream's head before the
        # request leaves its queue, and until a token went out a failure can go to another replica.
        self.streaming = content_type.startswith("text/event-stream")

    def on_body(self, data: bytes) -> None:
        if self.bad:
            return
        if not self.streaming:
            self.parts.append(data)
            return
        now = self.last_data = self.ctx.clock()
        if self.chunks == 0:
            self._open_stream()
        self.chunks += 1
        self.out.append(self.response.frame(data))
        found = token_events(self.tail, data)
        self.tail = data[-TAIL:] if len(data) >= TAIL else (self.tail + data)[-TAIL:]
        if not found:
            return
        if self.tokens == 0:
            self.first = now
            m = self.ctx.metrics
            m.child(m.ttft, *self.labels).observe(now - self.started)
            self.itl = m.child(m.itl, *self.labels)
            found -= 1
        else:
            self.itl.observe(now - self.prev)
            found -= 1
        if found:  # tokens that came in one read: no gap between them
            self.itl.counts[0] += found
            self.tokens += found
        self.prev = now
        self.tokens += 1

    def _open_stream(self) -> None:
        assert self.cand is not None
        self.out.append(self.response.stream_head(self.status, self.content_type,
                                                  self.ctx.served_by(self.cand, self.labels[2], self.extra)))

    def flush(self) -> None:
        out = self.out
        if not out:
            return
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        if self.response.write_framed(data) and self.conn is not None and not self.paused_at:
            self.conn.pause()  # the client is slower than the engine: stop reading upstream
            self.paused_at = self.ctx.clock()
            self.response.on_resume(self._resumed)

    def _resumed(self) -> None:
        """The client caught up: read the engine again; the time it was held back is not its gap."""
        if self.paused_at:
            self.last_data += self.ctx.clock() - self.paused_at
            self.paused_at = 0.0
        if self.conn is not None:
            self.conn.resume()

    def _pending(self) -> bytes:
        out = self.out
        data = b"".join(out)
        out.clear()
        return data

    def on_done(self) -> None:
        self.conn = None
        if self.bad:
            self._retry(self.bad)
            return
        m = self.ctx.metrics
        if self.streaming:
            if self.chunks == 0:
                self._open_stream()
            self.response.end(self._pending())
            if self.tokens > 1:
                m.child(m.tpot, *self.labels).observe((self.prev - self.first) / (self.tokens - 1))
            m.child(m.e2e, *self.labels).observe(self.ctx.clock() - self.started)
            self._end("ok")
            return
        cand = self.cand
        assert cand is not None
        body = self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)
        self.response.send(self.status, body, self.content_type, self.ctx.served_by(cand, self.labels[2],
                                                                                        self.extra))
        if self.status < 400:
            e2e = self.ctx.clock() - self.started
            m.child(m.e2e, *self.labels).observe(e2e)
            timing = reported_timing(body)
            if timing is not None:  # the engine said when its first token came and how fast the rest
                ttft_s, tpot_s, engine_s = timing
                m.child(m.ttft, *self.labels).observe(max(0.0, e2e - engine_s + ttft_s))
                if tpot_s > 0:
                    m.child(m.tpot, *self.labels).observe(tpot_s)
        else:
            m.child(m.rejections, self.call.slo.name, f"engine_{self.status}").inc()
        self._end("ok" if self.status < 400 else "rejected")

    def on_error(self, error: UpstreamError) -> None:
        self.conn = None
        if self.ended:
            return
        if not isinstance(error, Unreachable):
            self.reached = True
        if not self.response.started:
            self._retry(str(error))
            return
        # Tokens already went out: no retry (never a token twice). Say so in the stream and end it.
        assert self.cand is not None
        rid = self.cand.endpoint.replica_id
        self.ctx.replicas.failed(rid, self.cand.endpoint.url)
        log.warning("replica %s failed mid-stream: %s", rid, error)
        event = wire.sse({"error": {"message": f"upstream replica failed mid-stream: {error}",
                                    "type": "server_error", "code": 502}})
        self.response.end(self._pending() + self.response.frame(event))
        self._end("error")

    # the end
    def outcome_or_raise(self) -> str:
        if self.error is not None:
            raise self.error
        return self.outcome

    def abandon(self) -> None:
        """The client went away, or was dropped for not reading: stop the engine's work (close
        the connection), count it. Never the replica's failure."""
        if self.ended:
            return
        self.abandoned = True
        self.out.clear()
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.abort()
        self._end("client_timeout" if self.response.timed_out else "cancelled")

    def _fail(self, error: ApiError) -> None:
        if self.waiter is None and not self.response.started:
            self.response.send(error.status, error.body(), headers=[("retry-after", "1")] if error.status == 503
                               else ())
        self._end("error", error)

    def _handed_over(self) -> None:
        """The router took the request, slot and answer, over (`FlightContext.reroute`)."""
        self.ended = True
        self.outcome = "rerouted"
        self.ctx.watch.discard(self)

    def _end(self, outcome: str, error: ApiError | None = None) -> None:
        if self.ended:
            return
        self.ended = True
        self.outcome, self.error = outcome, error
        self.ctx.watch.discard(self)
        if self.cand is not None:
            self.ctx.replicas.closed(self.cand.endpoint.replica_id, self.call.route.seqs)
        if self.owner:
            self.ctx.ended(self.call, outcome)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result((outcome, error))


class Watch:
    """Deadlines of the flights in progress (on the router's clock), swept every `interval_s`
    while any exist: one timer for the router instead of one per request (timeouts are seconds;
    a tenth more is fine)."""

    def __init__(self, clock: Clock = time.perf_counter, interval_s: float = 0.1) -> None:
        self.clock, self.interval_s = clock, interval_s
        self.flights: set[Flight] = set()
        self.timer: asyncio.TimerHandle | None = None

    def add(self, flight: Flight, wait_s: float) -> float:
        """Watch `flight`; returns its deadline on the watch's clock."""
        now = self.clock()
        self.flights.add(flight)
        if self.timer is None:
            self.timer = asyncio.get_running_loop().call_later(self.interval_s, self._sweep)
        return now + wait_s

    def discard(self, flight: Flight) -> None:
        self.flights.discard(flight)

    def _sweep(self) -> None:
        now = self.clock()
        for flight in list(self.flights):
            flight.check(now)
        self.timer = asyncio.get_running_loop().call_later(self.interval_s, self._sweep) if self.flights else None

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


async def fly(ctx: FlightContext, call: Call, order: list[Candidate], response: Responder, started: float,
              payload: bytes, *, extra: tuple[tuple[str, str], ...] = (), tiers: Mapping[str, str] | None = None
              ) -> Flight:
    """A flight for a coroutine that needs its outcome (the request's slot stays with the caller):
    begun, awaited, abandoned if the caller is cancelled."""
    waiter: asyncio.Future[Ended] = asyncio.get_running_loop().create_future()
    flight = Flight(ctx, call, order, response, started, payload, extra=extra, tiers=tiers, waiter=waiter)
    flight.begin()
    try:
        await waiter
    except asyncio.CancelledError:
        flight.abandon()
        raise
    return flight
