"""The Serve replica's follow loop (isleserve.app.RouterThread._follow) against a fake controller
and a fake `ray.get` that advances an injected clock: every call has a timeout (an actor being
restarted must not stop the loop), a controller silent past the limit makes the router degraded,
and its next answer clears it."""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
from typing import Any

import pytest
from ray import exceptions as ray_exceptions
from ray.exceptions import GetTimeoutError

from isleserve import app as serve
from router.cli import table_from_config
from router.config import DEV_ADMIN_KEY, DEV_KEY, RouterConfig, sha256
from router.contact import ControllerContact
from router.server import Router

pytestmark = pytest.mark.unit


class Done(Exception):
    """The fake controller has no more answers: the loop ends."""


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


class Method:
    def __init__(self, name: str) -> None:
        self.name = name

    def remote(self, *args: Any) -> str:
        return self.name


class Controller:
    table, observe, plan, topology = Method("table"), Method("observe"), Method("plan"), Method("topology")


class FakeRay:
    """`ray.get` as the loop calls it: each call takes a second; a False answer is a timeout."""

    exceptions = ray_exceptions

    def __init__(self, clock: Clock, table: Any, answers: list[bool], router: Router) -> None:
        self.clock, self.table, self.answers, self.router = clock, table, answers, router
        self.timeouts: list[float | None] = []
        self.degraded: list[bool] = []

    def get(self, ref: str, timeout: float | None = None) -> Any:
        self.timeouts.append(timeout)
        self.clock.now_s += 1.0
        if ref == "table":  # what /health says when the loop asks again
            self.degraded.append(self.router.silence is not None
                                 and self.router.controller_health().get("status") == "degraded")
            if not self.answers:
                raise Done
            if not self.answers.pop(0):
                raise GetTimeoutError("Get timed out: some object(s) not ready.")
            return self.table
        return {}


def test_the_follow_loop_says_when_the_controller_is_silent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serve, "FOLLOW_INTERVAL_S", 0.0)
    config = RouterConfig.model_validate({
        "keys": [{"tenant": "t", "key_sha256": sha256(DEV_KEY)}],
        "admin_keys": [{"tenant": "ops", "key_sha256": sha256(DEV_ADMIN_KEY)}],
        "replicas": [{"replica_id": "r0", "url": "http://127.0.0.1:9", "model": "m"}]})
    router = Router(config, table_from_config(config))
    clock = Clock()
    router.contact = ControllerContact(clock)
    fake = FakeRay(clock, router.replicas.table, [True] + [False] * 12 + [True], router)
    thread = serve.RouterThread.__new__(serve.RouterThread)
    parts: Any = thread  # the loop's parts, without its listener thread
    parts.ray, parts.controller, parts.router = fake, Controller(), router
    with pytest.raises(Done):
        asyncio.run(thread._follow())
    assert set(fake.timeouts) == {serve.CONTROLLER_TIMEOUT_S}
    # the table asked at 1 s (answered), 3..14 s (silent), 15 s (answered), 17 s; each sees what
    # the tick before it found: silent for 11 s (more than 10) at the tick that asked at 12 s
    assert fake.degraded == [False] * 11 + [True] * 3 + [False]
    assert router.silence is None and router.controller_health() == {}


def test_a_router_that_cannot_start_says_why_and_closes_its_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The router's port is taken: the thread reports the error to Serve (which retries the
    replica) and closes the event loop it made (left open, the loop and its self-pipe's two
    sockets wait for the garbage collector, which warns of them in whatever runs then)."""
    made: list[asyncio.AbstractEventLoop] = []
    new_loop = asyncio.new_event_loop

    def recorded() -> asyncio.AbstractEventLoop:
        made.append(new_loop())
        return made[-1]

    monkeypatch.setitem(sys.modules, "uvloop", None)  # asyncio's own loop, which the test can see
    monkeypatch.setattr(asyncio, "new_event_loop", recorded)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        config = RouterConfig.model_validate({
            "host": "127.0.0.1", "port": taken.getsockname()[1],
            "keys": [{"tenant": "t", "key_sha256": sha256(DEV_KEY)}],
            "admin_keys": [{"tenant": "ops", "key_sha256": sha256(DEV_ADMIN_KEY)}],
            "replicas": [{"replica_id": "r0", "url": "http://127.0.0.1:9", "model": "m"}]})
        thread = serve.RouterThread.__new__(serve.RouterThread)
        parts: Any = thread  # what `_run` uses, without Serve's controller
        parts.router, parts.ready, parts.error, parts.loop = Router(config, table_from_config(config)), \
            threading.Event(), None, None
        thread._run()
        assert thread.ready.is_set() and isinstance(thread.error, OSError), thread.error
        assert len(made) == 1 and made[0].is_closed() and thread.loop is None
    finally:
        taken.close()
