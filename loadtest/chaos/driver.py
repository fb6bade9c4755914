"""The chaos run's load: open-loop streaming chat completions at a rate the timeline can change,
each with a deadline, each recorded with everything the accounting needs (status, Retry-After,
the replica that served it, every word received, usage, the [DONE] marker, the error body or
the SSE error event as sent).

Built on the live driver's client (`loadtest.live.client.Target`: keep-alive connections through
httpx) and the SSE splitter (wire.sse), events read as they arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from loadtest.chaos.load import ChaosRequest, RequestFactory
from loadtest.live.client import Target
from loadtest.workloads.prompts import prompt_text
from wire.client import ClientError
from wire.sse import SseSplitter, json_events, output_text

CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True, slots=True, kw_only=True)
class ChaosRecord:
    """One request as the client saw it. Times are seconds on the run's clock."""

    index: int
    slo_class: str
    seed: int
    max_tokens: int
    sent_s: float
    end_s: float | None = None
    """When the answer ended (None: no end before the deadline)."""
    status: int = 0
    retry_after: str | None = None
    replica: str = ""
    prefill_replica: str = ""
    tier: str = ""
    first_token_s: float | None = None
    """Seconds from the send to the first word."""
    last_token_s: float | None = None
    words: tuple[str, ...] = ()
    usage_tokens: int | None = None
    done: bool = False
    """The stream ended with `data: [DONE]`."""
    error: Any = None
    """The error as sent: the JSON body of a non-200 answer, or the payload of an SSE error event."""
    transport_error: str = ""
    """The connection failed or closed before the answer ended."""
    timed_out: bool = False


@dataclass(slots=True)
class _Sse:
    """SSE events of one stream as they are read."""

    words: list[str] = field(default_factory=list)
    first_at: float | None = None
    last_at: float | None = None
    usage: int | None = None
    done: bool = False
    error: Any = None
    sse: SseSplitter = field(default_factory=SseSplitter)

    def feed(self, data: bytes, now: float) -> None:
        for ev in json_events(self.sse, data):
            if ev.done:
                self.done = True
            elif ev.bad:
                self.error = self.error or {"unparseable_event": ev.bad[:200].decode("utf-8", "replace")}
            elif ev.event is not None:
                self._event(ev.event, now)

    def _event(self, event: dict[str, Any], now: float) -> None:
        if "error" in event:
            self.error = event
        text = output_text(event) if "choices" in event else None
        if text:
            self.words.extend(text.split())
            self.first_at = self.first_at if self.first_at is not None else now
            self.last_at = now
        usage = event.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.usage = usage["completion_tokens"]


class ChaosDriver:
    """Sends requests from `factory` open loop at `rate_rps` times `multiplier` until stopped."""

    def __init__(self, target: Target, factory: RequestFactory, model: str, api_key: str, rate_rps: float,
                 deadline_s: float, seed: int = 0) -> None:
        self.target, self.factory, self.model = target, factory, model
        self.rate_rps, self.deadline_s = rate_rps, deadline_s
        self.multiplier = 1.0
        self.rng = random.Random(f"gaps:{seed}")
        self.tag = secrets.token_hex(4)
        self.headers = {"content-type": "application/json", "accept": "text/event-stream",
                        "authorization": f"Bearer {api_key}"}
        self.t0 = time.perf_counter()
        self.stopping = asyncio.Event()
        self.tasks: list[asyncio.Task[ChaosRecord]] = []
        self.max_lag_s = 0.0

    def now(self) -> float:
        return time.perf_counter() - self.t0

    async def run(self) -> list[ChaosRecord]:
        """Send until `stop()`, then wait for every request (each ends by its deadline)."""
        due = self.now()
        while not self.stopping.is_set():
            wait = due - self.now()
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), wait)
                if self.stopping.is_set():
                    break
            self.max_lag_s = max(self.max_lag_s, self.now() - due)
            req = self.factory.make(len(self.tasks))
            self.tasks.append(asyncio.create_task(self.one(req)))
            due += self.rng.expovariate(self.rate_rps * self.multiplier)
        return list(await asyncio.gather(*self.tasks))

    def stop(self) -> None:
        self.stopping.set()

    def in_flight(self) -> int:
        return sum(1 for t in self.tasks if not t.done())

    def body(self, req: ChaosRequest) -> bytes:
        text = prompt_text(req.trace(), f"{self.tag}:{req.index}")
        return orjson.dumps({"model": self.model, "messages": [{"role": "user", "content": text}],
                             "max_tokens": req.max_tokens, "ignore_eos": True, "seed": req.seed, "stream": True,
                             "stream_options": {"include_usage": True}})

    async def one(self, req: ChaosRequest) -> ChaosRecord:
        body = self.body(req)
        sse, parts = _Sse(), list[bytes]()
        status, headers, problem, timed_out = 0, dict[str, str](), "", False
        sent = time.perf_counter()
        try:
            async with (asyncio.timeout(self.deadline_s),
                        self.target.post(CHAT_PATH, body, {**self.headers, "x-slo-class": req.slo_class}) as answer):
                status, headers = answer.status, dict(answer.headers)
                if status == 200:
                    await self.target.body(answer, sse.feed)
                else:
                    parts.append(await answer.read())
        except TimeoutError:
            timed_out = True
        except ClientError as err:
            problem = f"{err.kind}: {err}"[:200]
        except (OSError, ValueError, IndexError) as err:
            problem = f"{type(err).__name__}: {err}"[:200]
        end = time.perf_counter()
        error: Any = sse.error
        if status not in (0, 200):
            try:
                error = orjson.loads(b"".join(parts))
            except orjson.JSONDecodeError:
                error = {"unparseable_body": b"".join(parts)[:300].decode("utf-8", "replace")}
        return ChaosRecord(
            index=req.index, slo_class=req.slo_class, seed=req.seed, max_tokens=req.max_tokens,
            sent_s=sent - self.t0, end_s=None if timed_out else end - self.t0, status=status,
            retry_after=headers.get("retry-after"), replica=headers.get("x-isle-replica", ""),
            prefill_replica=headers.get("x-isle-prefill-replica", ""), tier=headers.get("x-isle-tier", ""),
            first_token_s=None if sse.first_at is None else sse.first_at - sent,
            last_token_s=None if sse.last_at is None else sse.last_at - sent, words=tuple(sse.words),
            usage_tokens=sse.usage, done=sse.done, error=error, transport_error=problem, timed_out=timed_out)
