"""The router's `/health` and `/metrics` when it does not hear from its controller (router.contact),
on the real router on loopback: "degraded" with the reason (still HTTP 200),
`isle_controller_degraded` 1 and the `controller_unreachable` alert, in every worker (a restarted
one included), cleared when the controller answers again. The adversary found `/health` "ok" and
the gauge 0 with the controller actor gone for minutes."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from typing import Any

import pytest

from control.state.alarms import Alarms
from router.cli import table_from_config
from router.config import DEV_ADMIN_KEY, DEV_KEY, RouterConfig, sha256
from router.contact import ControllerContact
from router.server import Router
from tests.support.wait import wait_until_async

pytestmark = pytest.mark.integration
MODEL = "llama-3.1-8b"
GONE = "The actor died unexpectedly before finishing this task."


class Clock:
    def __init__(self, now_s: float) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def _router(workers: int) -> Router:
    config = RouterConfig.model_validate({
        "port": 0, "workers": workers, "keys": [{"tenant": "t", "key_sha256": sha256(DEV_KEY)}],
        "admin_keys": [{"tenant": "ops", "key_sha256": sha256(DEV_ADMIN_KEY)}], "pd": {"enabled": False},
        "replicas": [{"replica_id": "r0", "url": "http://127.0.0.1:9", "model": MODEL}]})
    plan = {"policy": "p", "controller": {"table_version": 1, "health": Alarms().health()}}
    return Router(config, table_from_config(config), plan=plan)


async def _get(port: int, path: str) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {DEV_ADMIN_KEY}\r\n"
                 "connection: close\r\n\r\n".encode())
    raw = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


async def _health(port: int) -> dict[str, Any]:
    status, body = await _get(port, "/health")
    assert status == 200  # degraded or not: the data plane serves
    answer: dict[str, Any] = json.loads(body)
    return answer


async def _metrics(port: int) -> str:
    return (await _get(port, "/metrics"))[1].decode()


def test_a_silent_controller_makes_the_router_degraded() -> None:
    asyncio.run(_silent_controller())


async def _silent_controller() -> None:
    router = _router(workers=1)
    clock = Clock(1000.0)
    router.contact = ControllerContact(clock)
    await router.start()
    try:
        assert await _health(router.port) == {"status": "ok", "replicas": 1}
        assert "isle_controller_degraded 0.0" in await _metrics(router.port)
        clock.now_s = 1005.0
        router.contact.failed(RuntimeError(GONE))
        assert (await _health(router.port))["status"] == "ok"  # within the limit
        clock.now_s = 1023.0
        assert await _health(router.port) == {
            "status": "degraded", "replicas": 1, "reasons": [f"controller not answering for 23 s (last: {GONE})"]}
        text = await _metrics(router.port)
        assert "isle_controller_degraded 1.0" in text
        assert 'isle_controller_alert{kind="controller_unreachable"} 1.0' in text
        router.contact.answered()
        assert await _health(router.port) == {"status": "ok", "replicas": 1}
        text = await _metrics(router.port)
        assert "isle_controller_degraded 0.0" in text and 'kind="controller_unreachable"' not in text
    finally:
        await router.stop()


def test_every_worker_says_the_controller_is_silent() -> None:
    """What the Serve replica's follow loop does: the silence it sees goes to the other workers."""
    asyncio.run(_every_worker())


async def _answers(port: int, n: int = 20) -> set[str]:
    """/health's status over `n` new connections (the kernel spreads them over the workers)."""
    return {(await _health(port))["status"] for _ in range(n)}


async def _every_worker() -> None:
    router = _router(workers=2)
    clock = Clock(time.time() - 30.0)
    router.contact = ControllerContact(clock)  # the last answer was 30 s ago
    await router.start()
    try:
        assert await _answers(router.port) == {"ok"}
        clock.now_s = time.time()
        router.contact.failed(RuntimeError(GONE))
        await router.set_silence(router.contact.silence())
        assert await _answers(router.port) == {"degraded"}
        reasons = {r for _ in range(10) for r in (await _health(router.port))["reasons"]}
        assert all(re.fullmatch(rf"controller not answering for 3\d s \(last: {GONE}\)", r) for r in reasons)
        assert "isle_controller_degraded 1.0" in await _metrics(router.port)
        assert router.workers is not None
        (pid,) = router.workers.pids()
        os.kill(pid, signal.SIGKILL)  # a worker restarted meanwhile starts from the newest view
        workers = router.workers
        await wait_until_async(lambda: workers.pids() not in ([], [pid]), 20, "a new worker", interval_s=0.1)
        assert await _answers(router.port) == {"degraded"}
        router.contact.answered()
        await router.set_silence(router.contact.silence())
        assert await _answers(router.port) == {"ok"}
        assert "isle_controller_degraded 0.0" in await _metrics(router.port)
    finally:
        await router.stop()
