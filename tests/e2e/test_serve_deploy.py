"""`ray start --head` then `serve deploy`, as an operator does it, against a Ray head of its own.

The head runs as the README's multi-node setup says: token authentication on (a token file of
its own, 0600; every `ray`/`serve` command and the product's own read it from
RAY_AUTH_TOKEN_PATH), the dashboard answering nobody without it. It runs with `--block` in a new
session (its own temp dir, free ports, loopback only), so
that stopping it touches nothing else on the machine: SIGTERM to that `ray start` process stops
the head's processes (`RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0`: no 30 s drain), and whatever
is still left in that session (worker processes, engines) is killed by pid. Never `ray stop`:
it stops every Ray process of the user on the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
import yaml

from isleserve.run import write_token
from loadtest.live.deploy import port_in_use, ray_ports
from router.config import DEV_ADMIN_KEY, DEV_KEY
from tests.conftest import ROOT
from tests.support.wait import START_S, wait_until
from wire.processes import ChildExited, ChildNotReady, Group, Output, ReadyProbe, Stop, session_pids
from wire.supervisor import Child

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]  # past START_S waits
BIN = Path(sys.executable).parent
PORT_OPTIONS = ("--port", "--dashboard-port", "--ray-client-server-port", "--node-manager-port",
                "--object-manager-port", "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
                "--metrics-export-port", "--runtime-env-agent-port")


@dataclass
class Head:
    proc: Child
    dashboard: str
    address: str
    """The GCS address (`ray.init` and the product's own commands)."""
    temp_dir: Path
    env: dict[str, str]
    """With the head's token (RAY_AUTH_MODE=token, RAY_AUTH_TOKEN_PATH)."""

    def cli(self, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / "serve"), *args, "-a", self.dashboard], cwd=ROOT, capture_output=True,
                              text=True, timeout=timeout_s, check=False, env=self.env)

    def status(self) -> dict[str, object]:
        out = self.cli("status").stdout
        return yaml.safe_load(out)["applications"]["isleserve"]  # type: ignore[no-any-return]


def _status(url: str, token: Path | None) -> int:
    headers = {"authorization": f"Bearer {token.read_text().strip()}"} if token is not None else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        err.close()
        return int(err.code)
    except OSError:
        return 0


def _answers(url: str, token: Path) -> bool:
    return _status(url, token) == 200


@pytest.fixture(scope="module")
def head() -> Iterator[Head]:
    if port_in_use(8000):
        pytest.fail("127.0.0.1:8000 is taken: configs/local.yaml's router needs it")
    temp_dir = Path(tempfile.mkdtemp(prefix="isle-ray-", dir="/tmp"))  # short: Ray's socket paths live here
    ports = dict(zip(PORT_OPTIONS, ray_ports(len(PORT_OPTIONS)), strict=True))
    token = write_token(str(temp_dir / "state"))
    env = {**os.environ, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0", "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN_PATH": str(token)}
    cmd = [str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--dashboard-host",
           "127.0.0.1", "--temp-dir", str(temp_dir), "--num-cpus", "2", "--disable-usage-stats",
           *(x for option, port in ports.items() for x in (option, str(port)))]
    dashboard = f"http://127.0.0.1:{ports['--dashboard-port']}"
    # SIGTERM to `ray start`; 60 s for it, 20 s more for what is left of its session, then SIGKILL
    proc = Child(cmd, name="ray start --head", ready=ReadyProbe(lambda: _answers(f"{dashboard}/api/version", token)),
                 cwd=ROOT, env=env,
                 group=Group.SESSION, stdout=Output.DEVNULL, stderr=Output.DEVNULL,
                 stop=Stop(grace_s=60.0, linger_s=20.0)).start()
    try:
        try:
            proc.wait_ready(START_S, poll_s=1.0, stop_on_failure=False)
        except ChildExited:
            pytest.fail("ray start --head exited")
        except ChildNotReady:
            pytest.fail("the Ray head's dashboard did not answer within 90 s")
        refused = _status(f"{dashboard}/api/jobs/", None)  # the job API (runs any entrypoint): not without the token
        assert refused == 401, refused
        yield Head(proc=proc, dashboard=dashboard, address=f"127.0.0.1:{ports['--port']}", temp_dir=temp_dir, env=env)
    finally:
        proc.stop()
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert not session_pids(proc.pid) and not port_in_use(8000)


def _deploy(head: Head, config: str, timeout_s: float = START_S) -> dict[str, object]:
    """`serve deploy` (it only sends the request), then `serve status` until this deployment settles."""
    sent_at = time.time()
    deployed = head.cli("deploy", config)
    assert deployed.returncode == 0, deployed.stderr

    def settled() -> dict[str, object] | None:  # KeyError, TypeError, YAMLError: not deployed yet
        app = head.status()
        done = app["status"] in ("RUNNING", "DEPLOY_FAILED") and float(str(app["last_deployed_time_s"])) >= sent_at
        return app if done else None

    return wait_until(settled, timeout_s, "serve status settled", interval_s=2,
                      ignore=(KeyError, TypeError, yaml.YAMLError), seen=lambda: head.cli("status").stdout)


def test_a_failing_build_shows_the_products_message(head: Head, tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "configs/local.yaml").read_text())
    doc["applications"][0]["args"]["pools"][0]["tp"] = 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    app = _deploy(head, str(bad))
    assert app["status"] == "DEPLOY_FAILED"
    assert "invalid isleserve args: pools[0].tp: Input should be greater than or equal to 1" in str(app["message"])


def test_serve_deploy_local_config_runs_and_answers(head: Head) -> None:
    app = _deploy(head, "configs/local.yaml")
    assert app["status"] == "RUNNING", app["message"]
    # RUNNING means the product is up: the endpoint answers at once, no retry
    with openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key=DEV_KEY, max_retries=0, timeout=30) as client:
        assert [m.id for m in client.models.list()] == ["llama-3.1-8b"]
        chat = client.chat.completions.create(model="llama-3.1-8b", messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=3)
        assert chat.usage is not None and chat.usage.completion_tokens == 3


def _engines(head: Head, what: bytes = b"sim-engine") -> list[int]:
    out = []
    for pid in session_pids(head.proc.pid):
        try:
            if what in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(pid)
        except OSError:
            continue
    return out


def test_a_redeploy_with_two_router_workers_serves_from_both(head: Head, tmp_path: Path) -> None:
    doc = yaml.safe_load((ROOT / "configs/local.yaml").read_text())
    doc["applications"][0]["args"]["router"]["workers"] = 2
    config = tmp_path / "two-workers.yaml"
    config.write_text(yaml.safe_dump(doc))
    app = _deploy(head, str(config))
    assert app["status"] == "RUNNING", app["message"]
    assert len(_engines(head, b"router.worker")) == 1  # the Serve replica's router is the first worker
    seen: set[int] = set()

    def both_answer() -> bool:  # a new connection each: the kernel spreads them over both workers
        req = urllib.request.Request("http://127.0.0.1:8000/admin/replicas",
                                     headers={"authorization": f"Bearer {DEV_ADMIN_KEY}", "connection": "close"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            seen.add(json.loads(resp.read())["worker"])
        return seen == {0, 1}

    wait_until(both_answer, START_S, "both workers answer", interval_s=0.1)
    with openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key=DEV_KEY, max_retries=0, timeout=30) as client:
        for _ in range(4):
            out = client.completions.create(model="llama-3.1-8b", prompt="hi", max_tokens=2)
            assert out.usage is not None and out.usage.completion_tokens == 2


def test_serve_shutdown_and_stop_controller_leave_nothing_running(head: Head) -> None:
    engines = _engines(head)
    assert len(engines) == 4  # configs/local.yaml: prefill, decode, two mixed
    assert head.cli("shutdown", "-y").returncode == 0
    assert _engines(head) == engines  # Serve's shutdown leaves the detached controller's replicas ...
    stop = subprocess.run([sys.executable, "-m", "pools", "stop-controller", "--address", head.address], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False, env=head.env)
    assert stop.returncode == 0, stop.stderr  # ... the product's own command stops them
    wait_until(lambda: not _engines(head) and not port_in_use(8000), START_S, "engines stopped, port 8000 free",
               interval_s=0.5)
    assert not _engines(head, b"router.worker")
