"""A hung engine (SIGSTOP: the process lives, its port still takes connections, nothing answers)
with the controller's real health loop cadence and a real simulated engine: detected and
restarted within 10 s, and the request it held ends instead of hanging for the router's 60 s
idle timeout (the kill closes its connection: the router retries or fails it cleanly)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from control.actors import HEALTH_INTERVAL_S
from control.backend import LocalBackend
from control.controller import ControllerCore
from control.replicas.sim import ReplicaProcess
from control.spec import ControllerSpec
from router.config import DEV_ADMIN_KEY, DEV_KEY, sha256
from tests.control.conftest import controller_spec, events, health_status, mixed_pool
from tests.support.clients import openai_client
from tests.support.engines import running_router
from tests.support.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.serial]
DETECT_S = 10.0


def _spec(state_dir: Path, time_scale: float = 1.0) -> ControllerSpec:
    return controller_spec(state_dir, mixed_pool(slo_classes=()), time_scale=time_scale)


def _stream(url: str, key: str, outcome: dict[str, object]) -> None:
    """A long streamed request (with the engines' key), held by the engine once it stops."""
    body = {"model": "llama-3.1-8b", "prompt": "hello", "max_tokens": 4000, "stream": True, "ignore_eos": True}
    started = time.monotonic()
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=httpx.Timeout(60.0),
                          headers={"authorization": f"Bearer {key}"}) as resp:
            for _ in resp.iter_bytes():
                outcome["streaming"] = True
        outcome["result"] = "ended"
    except httpx.HTTPError as err:
        outcome["result"] = f"failed: {type(err).__name__}"
    outcome["after_s"] = time.monotonic() - started


def test_a_stopped_engine_is_detected_and_restarted_within_10_s(tmp_path: Path) -> None:
    core = ControllerCore(_spec(tmp_path / "state"), LocalBackend())
    stopped_pid = 0
    try:
        core.deploy()
        running = core.running["mixed-0"]
        victim = running.replica
        assert isinstance(victim, ReplicaProcess) and victim.proc is not None
        old_url, stopped_pid = running.url, victim.proc.pid
        outcome: dict[str, object] = {}
        request = threading.Thread(target=_stream, args=(old_url, core.engine_api_key, outcome), daemon=True)
        request.start()
        wait_until(lambda: outcome.get("streaming"), 10, "the request streaming")

        os.kill(stopped_pid, signal.SIGSTOP)
        hung_at = time.monotonic()
        restarted_s = None
        while time.monotonic() - hung_at < 30:  # the health loop: a pass every HEALTH_INTERVAL_S, starts installed
            core.check()
            core.settle(timeout_s=HEALTH_INTERVAL_S)
            if core.running["mixed-0"].url != old_url and not core.status()["starting"]:
                restarted_s = time.monotonic() - hung_at
                break
        assert restarted_s is not None and restarted_s < DETECT_S, restarted_s
        new_url = core.running["mixed-0"].url
        assert health_status(new_url) == 200 and victim.hung == 1 and victim.restarts == 1
        with pytest.raises(ProcessLookupError):  # killed, not left stopped
            os.kill(stopped_pid, 0)
        request.join(5)
        assert not request.is_alive() and str(outcome["result"]).startswith(("failed", "ended"))
        assert float(str(outcome["after_s"])) < DETECT_S + 2  # not the 60 s of a read timeout
        assert health_status(core.running["mixed-1"].url) == 200  # the other one was never touched
        assert any(e["replica_id"] == "mixed-0" for e in events(tmp_path / "state", "restart"))
    finally:
        if stopped_pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped_pid, signal.SIGCONT)
        core.shutdown()


def _health_loop(core: ControllerCore, stop: threading.Event) -> None:
    """The controller actor's loop: a pass every HEALTH_INTERVAL_S, starts installed as they end."""
    while not stop.is_set():
        core.check()
        core.settle(timeout_s=HEALTH_INTERVAL_S)


def _through_router(url: str, seed: int) -> tuple[str, str, float]:
    started = time.monotonic()
    client = openai_client(url, DEV_KEY)
    raw = client.chat.completions.with_raw_response.create(
        model="llama-3.1-8b", messages=[{"role": "user", "content": f"request {seed}"}], max_tokens=12, seed=seed,
        stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    return raw.headers["x-isle-replica"], text, time.monotonic() - started


def test_requests_held_by_a_stopped_engine_go_to_another_replica(tmp_path: Path) -> None:
    """Behind the router (its upstream timeouts at their 60 s defaults): streams sent to the stopped
    engine got nothing yet, so when the controller kills it they are retried on the other replica;
    every client gets its whole answer, none waits anywhere near 60 s."""
    core = ControllerCore(_spec(tmp_path / "state", time_scale=0.05), LocalBackend())
    stop, stopped_pid = threading.Event(), 0
    loop = threading.Thread(target=_health_loop, args=(core, stop), daemon=True)
    try:
        core.deploy()
        victim = core.running["mixed-0"].replica
        assert isinstance(victim, ReplicaProcess) and victim.proc is not None
        config = {
            "port": 0, "require_keys": True,
            "keys": [{"tenant": "dev", "key_sha256": sha256(DEV_KEY)}],
            "admin_keys": [{"tenant": "ops", "key_sha256": sha256(DEV_ADMIN_KEY)}],
            "profiles": {"standard": {"picker": "round-robin-picker"}},
            "upstream": {"key_env": "ISLE_TEST_ENGINE_KEY"},
            "replicas": [{"replica_id": rid, "url": core.running[rid].url, "model": "llama-3.1-8b", "pool": "mixed",
                          "role": "mixed"} for rid in ("mixed-0", "mixed-1")],
        }
        os.environ["ISLE_TEST_ENGINE_KEY"] = core.engine_api_key  # the router process inherits it
        with running_router(config, tmp_path) as (_proc, url):
            assert _through_router(url, 0)[1]  # both up
            stopped_pid = victim.proc.pid
            os.kill(stopped_pid, signal.SIGSTOP)
            loop.start()
            with ThreadPoolExecutor(4) as pool:
                answers = list(pool.map(lambda seed: _through_router(url, seed), range(1, 5)))
        assert all(replica == "mixed-1" and text for replica, text, _ in answers), answers
        assert max(took for _, _, took in answers) < DETECT_S + 2, answers
        assert victim.hung == 1
    finally:
        os.environ.pop("ISLE_TEST_ENGINE_KEY", None)
        stop.set()
        if loop.is_alive():
            loop.join(30)
        if stopped_pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped_pid, signal.SIGCONT)
        core.shutdown()
