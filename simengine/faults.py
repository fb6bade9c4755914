"""Fault injection for tests and chaos runs, switched at run time through POST /admin/faults:

    {"slowdown": 3.0}                 every step takes 3x as long
    {"link_bandwidth_factor": 0.25}   the TP link degrades (a quarter of the bandwidth, 4x latency)
    {"stall_s": 2.0}                  the engine stops stepping for 2 s (requests hang, then go on)
    {"crash_after_tokens": 5}         the process dies after 5 more tokens (mid-stream)
    {"refuse_connections": true}      stop accepting connections (false: accept again)
    {"fail_requests": 503}            answer generation requests with this status (0: stop)
    {"clear": true}                   back to normal
    {"kv_transport": "tcp", "kv_bandwidth_factor": 0.5, "kv_fail_rate": 0.1, "kv_peer": ...}
                                      the KV reads of a decode engine (`simengine.kvfaults`)
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from typing import Any, Protocol

from simengine.kvfaults import FIELDS as KV_FIELDS
from simengine.kvfaults import KvFaults

CRASH_EXIT_CODE = 17


class FaultTarget(Protocol):
    """What a fault acts on (the engine), without this module knowing the engine."""

    def set_link_factor(self, factor: float) -> None: ...

    async def set_accepting(self, accept: bool) -> None: ...


class Faults:
    def __init__(self) -> None:
        self.slowdown = 1.0
        self.link_factor = 1.0
        self.stall_until = 0.0
        self.crash_after: int | None = None
        self.tokens = 0
        self.refusing = False
        self.fail_status = 0
        self.kv = KvFaults()

    def describe(self) -> dict[str, Any]:
        return {"slowdown": self.slowdown, "link_bandwidth_factor": self.link_factor,
                "stalled_for_s": max(0.0, round(self.stall_until - time.monotonic(), 3)),
                "crash_after_tokens": self.crash_after, "refuse_connections": self.refusing,
                "fail_requests": self.fail_status, **self.kv.describe()}

    def apply(self, spec: dict[str, Any], engine: FaultTarget) -> None:
        if not isinstance(spec, dict):
            raise TypeError("a fault is a JSON object")
        unknown = set(spec) - {"slowdown", "link_bandwidth_factor", "stall_s", "crash_after_tokens",
                               "refuse_connections", "fail_requests", "clear", *KV_FIELDS}
        if unknown:
            raise ValueError(f"unknown fault fields {sorted(unknown)}")
        self._validate(spec)
        if spec.get("clear"):
            self.__init__()  # type: ignore[misc]
            engine.set_link_factor(1.0)
            asyncio.get_running_loop().create_task(engine.set_accepting(True))
            return
        if "slowdown" in spec:
            self.slowdown = float(spec["slowdown"])
            if self.slowdown < 1.0:
                raise ValueError("slowdown must be >= 1")
        if "link_bandwidth_factor" in spec:
            factor = float(spec["link_bandwidth_factor"])
            if not 0 < factor <= 1:
                raise ValueError("link_bandwidth_factor must be in (0, 1]")
            self.link_factor = factor
            engine.set_link_factor(factor)
        if "stall_s" in spec:
            self.stall_until = time.monotonic() + float(spec["stall_s"])
        if "crash_after_tokens" in spec:
            self.crash_after = self.tokens + int(spec["crash_after_tokens"])
        if "fail_requests" in spec:
            status = int(spec["fail_requests"])
            if status and not 400 <= status <= 599:
                raise ValueError("fail_requests is an HTTP error status (or 0 to stop)")
            self.fail_status = status
        self.kv.apply(spec)
        if "refuse_connections" in spec:
            self.refusing = bool(spec["refuse_connections"])
            asyncio.get_running_loop().create_task(engine.set_accepting(not self.refusing))

    @staticmethod
    def _validate(spec: dict[str, Any]) -> None:
        """Every field checked before anything changes (a rejected fault changes nothing)."""
        numbers = {k: float(spec[k]) for k in ("slowdown", "link_bandwidth_factor", "stall_s") if k in spec}
        if any(not math.isfinite(v) for v in numbers.values()):
            raise ValueError("fault values must be finite numbers")
        if numbers.get("slowdown", 1.0) < 1.0:
            raise ValueError("slowdown must be >= 1")
        if not 0 < numbers.get("link_bandwidth_factor", 1.0) <= 1:
            raise ValueError("link_bandwidth_factor must be in (0, 1]")
        if numbers.get("stall_s", 0.0) < 0:
            raise ValueError("stall_s must be >= 0")
        if "crash_after_tokens" in spec and int(spec["crash_after_tokens"]) < 0:
            raise ValueError("crash_after_tokens must be >= 0")
        status = int(spec.get("fail_requests", 0))
        if status and not 400 <= status <= 599:
            raise ValueError("fail_requests is an HTTP error status (or 0 to stop)")
        KvFaults.validate(spec)

    async def wait_if_stalled(self) -> None:
        left = self.stall_until - time.monotonic()
        if left > 0:
            await asyncio.sleep(left)

    def count_token(self) -> None:
        self.tokens += 1

    def maybe_crash(self) -> None:
        if self.crash_after is not None and self.tokens >= self.crash_after:
            os._exit(CRASH_EXIT_CODE)  # a crash, not a shutdown: no cleanup, connections reset
