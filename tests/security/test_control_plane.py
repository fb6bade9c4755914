"""The engines' API and fault-injection routes: the API wants the deployment's engine key when the
controller starts the engine (vLLM's --api-key: only the router has it); the fault routes are
absent unless an engine is started for tests or chaos (`--admin-routes`), and then behind the
deployment's engine admin token when it has one (the controller draws both once and keeps them in
the private state directory)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from control.state.files import DiskFiles
from control.state.secrets import TOKEN_FILE, drawn_secret
from tests.conftest import ROOT
from wire import client
from wire.openai import ADMIN_TOKEN_ENV, API_KEY_ENV
from wire.processes import ReadyLine
from wire.supervisor import Child

pytestmark = pytest.mark.integration
ENGINE = ["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--port", "0"]


@contextmanager
def _engine(*flags: str, token: str | None = None, env: dict[str, str] | None = None) -> Iterator[str]:
    env = {**{k: v for k, v in os.environ.items() if k not in (ADMIN_TOKEN_ENV, API_KEY_ENV)}, **(env or {})}
    if token is not None:
        env[ADMIN_TOKEN_ENV] = token
    proc = Child([sys.executable, "-m", "pools", "sim-engine", *ENGINE, *flags], name="engine", cwd=ROOT, env=env,
                 ready=ReadyLine("ready:")).start()
    try:
        yield proc.wait_ready(30).split("ready:")[1].strip().removesuffix("/v1")
    finally:
        proc.stop()


def _status(method: str, url: str, key: str | None = None) -> int:
    base, path = url.split("/admin/", 1)
    with client.Client(base, key=key, timeout_s=5) as c:
        return c.request(method, f"/admin/{path}", json_body={"slowdown": 2} if method == "POST" else None).status


def test_without_admin_routes_faults_and_steps_do_not_exist() -> None:
    with _engine(token="ignored-without-the-flag") as base:
        assert _status("GET", f"{base}/admin/faults") == 404
        assert _status("POST", f"{base}/admin/faults", key="ignored-without-the-flag") == 404
        assert _status("GET", f"{base}/admin/steps") == 404


def test_with_a_token_the_admin_routes_want_it() -> None:
    with _engine("--admin-routes", token="s3cret-token") as base:
        assert _status("POST", f"{base}/admin/faults") == 401
        assert _status("POST", f"{base}/admin/faults", key="wrong") == 401
        assert _status("GET", f"{base}/admin/steps", key="s3cret-token") == 200
        assert _status("POST", f"{base}/admin/faults", key="s3cret-token") == 200
    with _engine("--admin-routes") as base:  # the test helpers' engines: no token, open (loopback only)
        assert _status("GET", f"{base}/admin/faults") == 200


def test_with_an_api_key_the_engine_api_wants_it_as_vllm_does() -> None:
    """VLLM_API_KEY (vLLM's --api-key, as the controller starts its engines): every path under /v1,
    /v2 and /inference wants it (401 `{"error":"Unauthorized"}` otherwise, an unknown path too);
    /health, /metrics and /tokenize stay open."""
    with _engine(env={API_KEY_ENV: "engine-key"}) as base:
        with client.Client(base, timeout_s=5) as anonymous:
            refused = anonymous.request("GET", "/v1/models")
            assert refused.status == 401 and json.loads(refused.body) == {"error": "Unauthorized"}
            assert anonymous.request("POST", "/v1/completions", json_body={"model": "llama-3.1-8b", "prompt": "x",
                                                                          "max_tokens": 1}).status == 401
            assert anonymous.request("GET", "/health").status == 200
            assert anonymous.request("GET", "/metrics").status == 200
            assert anonymous.request("POST", "/tokenize", json_body={"model": "llama-3.1-8b",
                                                                     "prompt": "x"}).status == 200
            for guarded in ("/v2/models", "/inference/v1/generate"):  # before any route, as vLLM's middleware
                assert anonymous.request("GET", guarded).status == 401
        with client.Client(base, key="wrong", timeout_s=5) as wrong:
            assert wrong.request("GET", "/v1/models").status == 401
        with client.Client(base, key="engine-key", timeout_s=5) as router:
            assert router.request("POST", "/v1/completions", json_body={"model": "llama-3.1-8b", "prompt": "x",
                                                                       "max_tokens": 1}).status == 200


def test_the_deployment_token_is_drawn_once_and_kept_private(tmp_path: Path) -> None:
    files = DiskFiles(tmp_path / "state")
    first = drawn_secret(files, TOKEN_FILE)
    assert len(first) == 64 and drawn_secret(files, TOKEN_FILE) == first  # a restarted controller: the same
    path = files.directory / TOKEN_FILE
    assert path.stat().st_mode & 0o777 == 0o600
