"""`python -m loadtest run`: replay a workload against a router on loopback and summarise it as
`vllm bench serve` does.

    python -m loadtest run --target http://127.0.0.1:8000 --workload azure-conv --duration 60 \
        [--max-requests N] [--rate-scale X] [--class-mix interactive=0.2,standard=0.6,batch=0.2] \
        [--api-key KEY] [--model M] [--concurrency-limit N] [--timeout S] [--classes FILE] \
        [--lora-adapters N|NAME,NAME... [--lora-skew S]] [--out results.jsonl] [--format text|json] [--progress]

Open loop: each request goes at its arrival time (with --concurrency-limit it waits for a slot;
latency counts from the send) as a streaming chat completion with `include_usage`, `max_tokens` =
its output tokens, `ignore_eos` (vLLM's) so lengths match the trace, `x-slo-class` = its class, and
a prompt of about its prompt tokens that shares leading text as its prefix blocks do. Nothing is
sent after --duration; a request running --timeout seconds is cancelled (`timeout`). Outcomes:
`ok`, `shed` (429), `timeout`, `error:<status>|<cause>`. Only loopback targets (127.0.0.0/8, ::1,
localhost): this tool makes load on this machine and nowhere else.

The client: keep-alive connections through httpx (loadtest.live.client, wire.client), SSE
events split as they are read (wire.sse) and parsed with orjson, each token timed when its
bytes are read.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import os
import secrets
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import orjson
from pydantic import ValidationError

from loadtest.live.client import Target, UsageError, loopback_target
from loadtest.model import OK, RequestResult, TraceRequest
from loadtest.summary import format_summary, summarize
from loadtest.workload import Workload, load_workload
from loadtest.workloads import WorkloadError
from loadtest.workloads.prompts import prompt_text
from pools.config import SLOClassConfig
from pools.model import DEFAULT_SLO_CLASSES, SLOClass
from topology.configfile import format_validation, load_yaml_file
from topology.errors import ParseError
from wire.client import ClientError
from wire.sse import SseSplitter, json_events, output_text

DEFAULT_KEY = "isle-dev-key"
CHAT_PATH = "/v1/chat/completions"


@dataclasses.dataclass(slots=True)
class _Stream:
    """One response's SSE events as they are read: token times, usage, errors."""

    token_times: list[float] = dataclasses.field(default_factory=list)
    usage: dict[str, Any] = dataclasses.field(default_factory=dict)
    sse: SseSplitter = dataclasses.field(default_factory=SseSplitter)
    done: bool = False
    error: str = ""

    def feed(self, data: bytes, now: float) -> None:
        for ev in json_events(self.sse, data):
            if ev.done:
                self.done = True
            elif ev.bad:
                self.error = self.error or f"unparseable event {ev.bad[:80]!r}"
            elif ev.event is not None:
                self._event(ev.event, now)

    def _event(self, event: dict[str, Any], now: float) -> None:
        if "error" in event:
            err = event["error"]
            self.error = str(err.get("message", err) if isinstance(err, dict) else err)[:200]
        if output_text(event):
            self.token_times.append(now)
        if isinstance(event.get("usage"), dict):
            self.usage = event["usage"]


def _outcome(status: int, stream: _Stream) -> str:
    if status == 200:
        if stream.error:
            return "error:stream"
        return OK if stream.done else "error:incomplete"
    return "shed" if status == 429 else f"error:{status}"


def _result(req: TraceRequest, start: float, sent: float, end: float, status: int, headers: dict[str, str],
            stream: _Stream, outcome: str, error: str) -> RequestResult:
    times = stream.token_times
    tokens = int(stream.usage.get("completion_tokens") or len(times))
    ttft = times[0] - sent if times else None
    e2e = end - sent if outcome == OK else None
    tpot = (e2e - ttft) / (tokens - 1) if e2e is not None and ttft is not None and tokens > 1 else None
    return RequestResult(
        index=req.index, slo_class=req.slo_class, sent_s=sent - start, outcome=outcome,
        prompt_tokens=int(stream.usage.get("prompt_tokens") or req.prompt_tokens), output_tokens=tokens,
        ttft_s=ttft, tpot_s=tpot, itls_s=tuple(b - a for a, b in itertools.pairwise(times)), e2e_s=e2e,
        tier=headers.get("x-isle-tier", ""), replica=headers.get("x-isle-replica", ""),
        prefill_replica=headers.get("x-isle-prefill-replica", ""), status=status, error=error)


# the run
class Driver:
    """Sends a workload open-loop and collects one `RequestResult` per request sent."""

    def __init__(self, target: Target, workload: Workload, model: str, api_key: str, *, timeout_s: float,
                 duration_s: float | None = None, concurrency_limit: int | None = None) -> None:
        self.target, self.workload, self.model = target, workload, model
        self.timeout_s, self.duration_s = timeout_s, duration_s
        self.slots = asyncio.Semaphore(concurrency_limit) if concurrency_limit else None
        self.headers = {"content-type": "application/json", "accept": "text/event-stream",
                        "authorization": f"Bearer {api_key}"}
        self.tag = secrets.token_hex(4)  # this run's prompt text is its own: no cache left by an earlier run
        self.sent = 0
        self.tally: Counter[str] = Counter()  # ok, shed, timeout, error
        self.stopping = asyncio.Event()
        self.max_lag_s = 0.0
        self.start = 0.0

    def body(self, req: TraceRequest) -> bytes:
        return orjson.dumps({
            "model": req.model or self.model, "messages": [{"role": "user", "content": prompt_text(req, self.tag)}],
            "max_tokens": req.output_tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}})

    async def run(self) -> tuple[list[RequestResult], float]:
        """Results in workload order, and the seconds from the first send to the last answer."""
        self.start = time.perf_counter()
        tasks: list[asyncio.Task[RequestResult]] = []
        for req in self.workload:
            wait = self.start + req.arrival_s - time.perf_counter()
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), wait)
            if self.slots is not None:
                await self.slots.acquire()
            now = time.perf_counter() - self.start
            if self.stopping.is_set() or (self.duration_s is not None and now >= self.duration_s):
                break
            self.max_lag_s = max(self.max_lag_s, now - req.arrival_s)
            tasks.append(asyncio.create_task(self.one(req)))
        results = list(await asyncio.gather(*tasks))
        return results, time.perf_counter() - self.start

    async def one(self, req: TraceRequest) -> RequestResult:
        body = self.body(req)
        stream, status, error = _Stream(), 0, ""
        headers: dict[str, str] = {}
        self.sent += 1
        sent = time.perf_counter()
        try:
            async with (asyncio.timeout(self.timeout_s),
                        self.target.post(CHAT_PATH, body, {**self.headers, "x-slo-class": req.slo_class}) as answer):
                status, headers = answer.status, dict(answer.headers)
                if status == 200:
                    await self.target.body(answer, stream.feed)
                else:
                    error = (await answer.read())[:300].decode("utf-8", "replace")
            outcome = _outcome(status, stream)
            error = error or stream.error
        except TimeoutError:
            outcome, error = "timeout", f"no end within {self.timeout_s:g} s"
        except ClientError as err:
            outcome, error = f"error:{err.kind}", str(err)[:200]
        except (OSError, ValueError, IndexError) as err:
            outcome, error = f"error:{type(err).__name__}", str(err)[:200]
        finally:
            if self.slots is not None:
                self.slots.release()
        self.tally[outcome if outcome in (OK, "shed", "timeout") else "error"] += 1
        return _result(req, self.start, sent, time.perf_counter(), status, headers, stream, outcome, error)

    def progress_line(self, width: int = 24) -> str:
        done, t = self.tally.total(), self.tally
        filled = round(width * done / max(1, len(self.workload)))
        return (f"[{'#' * filled}{'.' * (width - filled)}] {done}/{len(self.workload)} done, {self.sent - done} in "
                f"flight, ok {t['ok']}, shed {t['shed']}, timeout {t['timeout']}, error {t['error']}, "
                f"{time.perf_counter() - self.start:.0f} s")


async def report_progress(driver: Driver, tty: bool) -> None:
    """A line on stderr: redrawn every second on a terminal, every 5 s into a file."""
    every = 1.0 if tty else 5.0
    try:
        while True:
            await asyncio.sleep(every)
            print(("\r" if tty else "") + driver.progress_line(), end="" if tty else "\n", file=sys.stderr,
                  flush=True)
    except asyncio.CancelledError:
        print(("\r" if tty else "") + driver.progress_line(), file=sys.stderr, flush=True)
        raise


# the command
def load_classes(path: str | None) -> dict[str, SLOClass]:
    """SLO classes for goodput: a YAML list of classes, or a file with `slo_classes:` (a pools
    file, a router config, or a Serve config's application args); else the defaults."""
    if path is None:
        return {c.name: c for c in DEFAULT_SLO_CLASSES}
    try:
        raw = load_yaml_file(path, "SLO classes")
    except ParseError as err:
        raise UsageError(str(err)) from None
    if isinstance(raw, dict) and "slo_classes" not in raw:
        raw = next((a.get("args", {}) for a in raw.get("applications", []) if isinstance(a, dict)), raw)
    found = raw.get("slo_classes") if isinstance(raw, dict) else raw
    if not isinstance(found, list) or not found:
        raise UsageError(f"{path}: no SLO classes (a YAML list of {{name, priority, ttft_ms, tpot_ms}} or a "
                         "file with slo_classes:)")
    try:
        return {c.name: c for c in (SLOClassConfig.model_validate(x).to_slo() for x in found)}
    except ValidationError as err:
        raise UsageError(f"{path}: invalid SLO class: {format_validation(err)}") from None


def parse_mix(text: str | None) -> dict[str, float] | None:
    if text is None:
        return None
    mix: dict[str, float] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, _, weight = item.partition("=")
        try:
            mix[name.strip()] = float(weight)
        except ValueError:
            raise UsageError(f"--class-mix {text!r}: give CLASS=WEIGHT[,CLASS=WEIGHT...]") from None
    return mix


def lora_mix(args: argparse.Namespace) -> dict[str, object] | None:
    """--lora-adapters and --lora-skew as the workload spec's `lora:` (None: not a LoRA workload)."""
    text = (args.lora_adapters or "").strip()
    if not text:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    return {"adapters": int(text) if text.isdigit() else names, "skew": args.lora_skew}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtest run", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="router URL on loopback, e.g. http://127.0.0.1:8000")
    p.add_argument("--workload", required=True, help="azure-conv, azure-code, mooncake-conversation, "
                   "mooncake-synthetic, sharegpt-example, a trace file, or synthetic:poisson,rate=R,prompt=N,output=N")
    p.add_argument("--duration", type=float, help="send nothing after this many seconds (also cuts the workload)")
    p.add_argument("--max-requests", type=int, help="send at most this many requests")
    p.add_argument("--rate-scale", type=float, help="k times the workload's arrival rate over the same span")
    p.add_argument("--class-mix", help="SLO classes by weight, e.g. interactive=0.2,standard=0.6,batch=0.2")
    p.add_argument("--seed", type=int, help="workload seed (synthetic arrivals and lengths, class mix)")
    p.add_argument("--lora-adapters", help="a LoRA workload: each request names one of these adapters (a count: "
                   "lora-0, lora-1, ...; or NAME,NAME,...), Zipf over them (workload spec `lora:`)")
    p.add_argument("--lora-skew", type=float, default=1.0, help="the Zipf exponent over --lora-adapters (0: uniform)")
    p.add_argument("--api-key", default=os.environ.get("ISLE_API_KEY", DEFAULT_KEY),
                   help="bearer key (default: $ISLE_API_KEY, else the development key)")
    p.add_argument("--model", help="model to request (default: the first the router lists)")
    p.add_argument("--concurrency-limit", type=int, help="at most this many requests in flight")
    p.add_argument("--timeout", type=float, default=120.0, help="cancel a request after this many seconds")
    p.add_argument("--classes", help="YAML with the SLO classes goodput is judged by (default: the built-in three)")
    p.add_argument("--out", help="write every request's result here as JSON lines")
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.add_argument("--progress", action="store_true", help="progress on stderr even when it is not a terminal")
    return p


async def pick_model(target: Target, key: str) -> str:
    status, body = await target.get_json("/v1/models", key)
    models = body.get("data") if isinstance(body, dict) else None
    if status != 200 or not models:
        detail = body.get("error", {}).get("message", "") if isinstance(body, dict) else ""
        raise ConnectionError(f"GET /v1/models answered {status} {detail}".strip())
    return str(models[0]["id"])


async def drive(args: argparse.Namespace, target: Target, workload: Workload) -> tuple[Driver, list[RequestResult],
                                                                                      float]:
    model = args.model or await pick_model(target, args.api_key)
    driver = Driver(target, workload, model, args.api_key, timeout_s=args.timeout, duration_s=args.duration,
                    concurrency_limit=args.concurrency_limit)
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(2, driver.stopping.set)  # Ctrl-C: stop sending, let the in-flight finish
    tty = sys.stderr.isatty()
    progress = asyncio.create_task(report_progress(driver, tty)) if tty or args.progress else None
    try:
        results, elapsed = await driver.run()
    finally:
        if progress is not None:
            progress.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await progress
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(2)
        await target.aclose()
    return driver, results, elapsed


def report(args: argparse.Namespace, driver: Driver, results: list[RequestResult], elapsed_s: float,
           classes: dict[str, SLOClass]) -> None:
    summary = summarize(results, classes, elapsed_s)
    if args.out:
        with open(args.out, "wb") as f:
            for r in results:
                f.write(orjson.dumps(dataclasses.asdict(r)) + b"\n")
    unsent = len(driver.workload) - len(results)
    extra = {"target": args.target, "model": driver.model, "workload": driver.workload.record(),
             "max_send_lag_ms": round(driver.max_lag_s * 1000, 3), "unsent": unsent}
    if args.format == "json":
        print(orjson.dumps({**summary, **extra}, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode())
        return
    print(f"target {args.target}, model {driver.model}\n{driver.workload.describe()}")
    if unsent:
        print(f"not sent: {unsent} requests (stopped at --duration or by Ctrl-C)")
    if driver.max_lag_s > 0.1:
        print(f"warning: the client fell up to {driver.max_lag_s * 1000:.0f} ms behind the arrival times")
    print(format_summary(summary))


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(argv)
    try:
        host, port = loopback_target(args.target)
        classes = load_classes(args.classes)
        overrides = {"duration_s": args.duration, "max_requests": args.max_requests, "rate_scale": args.rate_scale,
                     "seed": args.seed, "class_mix": parse_mix(args.class_mix), "lora": lora_mix(args)}
        workload = load_workload(args.workload, overrides)
    except (UsageError, WorkloadError) as err:
        print(f"loadtest run: {err}", file=sys.stderr)
        return 2
    unknown = sorted({r.slo_class for r in workload} - set(classes))
    if unknown:
        print(f"loadtest run: no SLO for class {', '.join(unknown)}: completed requests count as meeting it",
              file=sys.stderr)
    try:
        driver, results, elapsed = _run(drive(args, Target(host, port), workload))
    except (OSError, ConnectionError) as err:
        print(f"loadtest run: cannot use {args.target}: {err}", file=sys.stderr)
        return 1
    report(args, driver, results, elapsed, classes)
    return 0 if any(r.ok for r in results) else 1


def _run(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)
