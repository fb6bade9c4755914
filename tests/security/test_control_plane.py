"""The engines' fault-injection routes: absent unless an engine is started for tests or chaos
(`--admin-routes`), and then behind the deployment's engine admin token when it has one (the
controller draws it once and keeps it in the private state directory)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pools.controller.admintoken import TOKEN_FILE, engine_admin_token
from pools.controller.statefiles import DiskFiles
from pools.engine.routes import ADMIN_TOKEN_ENV
from pools.supervisor import Child, ReadyLine
from pools.wire import client
from tests.conftest import ROOT

pytestmark = pytest.mark.integration
ENGINE = ["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--port", "0"]


@contextmanager
def _engine(*flags: str, token: str | None = None) -> Iterator[str]:
    env = {k: v for k, v in os.environ.items() if k != ADMIN_TOKEN_ENV}
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


def test_the_deployment_token_is_drawn_once_and_kept_private(tmp_path: Path) -> None:
    files = DiskFiles(tmp_path / "state")
    first = engine_admin_token(files)
    assert len(first) == 64 and engine_admin_token(files) == first  # a restarted controller: the same
    path = files.directory / TOKEN_FILE
    assert path.stat().st_mode & 0o777 == 0o600
