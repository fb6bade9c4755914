"""The live deployment's own Ray head: where its ports are chosen, and what a deploy that never
settles says. `serve` here is a stand-in script on PATH's place (BIN): the real one needs a Ray
head, which the e2e tier starts (tests/e2e/test_compare_live.py)."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtest.live import deploy
from loadtest.live.deploy import RAY_PORTS, DeployError, RayHead, ray_ports, serve_deploy
from wire.processes import Stop
from wire.supervisor import Child

pytestmark = pytest.mark.integration
EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")


def test_the_heads_ports_are_distinct_free_and_clear_of_the_kernels_ephemeral_range() -> None:
    ports = ray_ports(9)
    assert len(set(ports)) == 9
    if EPHEMERAL.exists() and int(EPHEMERAL.read_text().split()[0]) >= RAY_PORTS.stop:
        assert all(p in RAY_PORTS for p in ports)
    for port in ports:  # each still free to bind
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def _serve_script(tmp_path: Path, status_script: str) -> Path:
    """A `serve` that accepts `deploy` and answers `status` with `status_script` (shell)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    serve = bin_dir / "serve"
    serve.write_text(f'#!/bin/sh\nif [ "$1" = deploy ]; then exit 0; fi\n{status_script}\n')
    serve.chmod(0o755)
    return bin_dir


@pytest.fixture()
def head(tmp_path: Path) -> Iterator[RayHead]:
    """A stand-in head: a process that lives (the deploy checks that the head still runs)."""
    proc = Child([sys.executable, "-c", "import time; time.sleep(60)"], name="head", stop=Stop(grace_s=1.0)).start()
    try:
        yield RayHead(proc=proc, temp_dir=tmp_path, dashboard="http://127.0.0.1:9", address="127.0.0.1:9")
    finally:
        proc.stop()


def test_a_deploy_that_never_settles_says_what_serve_status_last_answered(
        head: RayHead, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deploy, "BIN", _serve_script(tmp_path, "echo 'ConnectionError: dashboard gone' >&2; exit 1"))
    with pytest.raises(DeployError, match=r"within 0.5 s; it last said: `serve status` exited with 1: "
                                          r"ConnectionError: dashboard gone"):
        serve_deploy(head, tmp_path / "c.yaml", "isleserve", 0.5)


def test_a_deploy_stuck_deploying_names_the_deployment_and_why(
        head: RayHead, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    status = ("cat <<EOF\napplications:\n  isleserve:\n    status: DEPLOYING\n    last_deployed_time_s: 9999999999\n"
              "    deployments:\n      Router:\n        status: UPDATING\n"
              "        message: 'Deployment Router has 1 replicas that have taken more than 30s to start'\nEOF")
    monkeypatch.setattr(deploy, "BIN", _serve_script(tmp_path, status))
    with pytest.raises(DeployError, match="it last said: DEPLOYING; Router: UPDATING Deployment Router has 1 replicas "
                                          "that have taken more than 30s"):
        serve_deploy(head, tmp_path / "c.yaml", "isleserve", 0.5)


def test_a_head_that_dies_while_the_deploy_settles_fails_at_once(
        head: RayHead, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deploy, "BIN", _serve_script(tmp_path, "exit 1"))
    head.proc.kill()
    head.proc.wait(10)
    with pytest.raises(DeployError, match=r"the Ray head \(`ray start --head`\) exited with -9"):
        serve_deploy(head, tmp_path / "c.yaml", "isleserve", 10)


def _status(state: str, deployed_at: float) -> str:
    return f"cat <<EOF\napplications:\n  isleserve:\n    status: {state}\n    last_deployed_time_s: {deployed_at}\nEOF"


def test_the_running_status_of_this_deploy_is_returned(
        head: RayHead, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deploy, "BIN", _serve_script(tmp_path, _status("RUNNING", 9999999999)))
    assert serve_deploy(head, tmp_path / "c.yaml", "isleserve", 10)["status"] == "RUNNING"


def test_an_earlier_deploys_running_status_is_not_taken_for_this_one(
        head: RayHead, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deploy, "BIN", _serve_script(tmp_path, _status("RUNNING", 1000)))
    with pytest.raises(DeployError, match=r"it last said: an earlier deploy's status .*: RUNNING"):
        serve_deploy(head, tmp_path / "c.yaml", "isleserve", 0.5)
