"""What the product checks and fixes about the Ray it starts or joins (isleserve.raysecurity,
isleserve.raylocal, isleserve.run): a refused build when Ray runs code for anyone on a routable
address, Serve's replica gRPC port bound to the node's address, the local head's environment,
and the run's token file."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from isleserve.raylocal import TOKEN_FILE, secure_env
from isleserve.raysecurity import exposure_problem, node_bound
from isleserve.run import write_token

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("node_ip", "auth_on", "insecure", "refused"), [
    ("127.0.0.1", False, False, False),
    ("::1", False, False, False),
    ("10.1.2.3", True, False, False),
    ("10.1.2.3", False, True, False),
    ("10.1.2.3", False, False, True),
    ("192.0.2.2", False, False, True),
])
def test_a_routable_ray_without_token_auth_is_refused_unless_insecure(node_ip: str, auth_on: bool, insecure: bool,
                                                                       refused: bool) -> None:
    problem = exposure_problem(node_ip, auth_on, insecure)
    assert (problem is not None) is refused
    if problem is not None:
        assert node_ip in problem and "RAY_AUTH_MODE=token" in problem and "insecure: true" in problem


def test_serve_replica_grpc_binds_to_the_node_address_not_all_interfaces() -> None:
    seen: list[str] = []

    def add_port(server: Any, address: str) -> int:
        seen.append(address)
        return 1234

    assert node_bound(add_port, lambda: "127.0.0.1")(None, "[::]:0") == 1234
    node_bound(add_port, lambda: "fd00::5")(None, "[::]:7000")
    node_bound(add_port, lambda: "10.0.0.9")(None, "10.0.0.9:0")  # an explicit address stays as it is
    assert seen == ["127.0.0.1:0", "[fd00::5]:7000", "10.0.0.9:0"]
    loopbacks = ("127.0.0.2", "localhost", "[::1]", "::ffff:127.0.0.1")
    assert all(exposure_problem(ip, False, False) is None for ip in loopbacks)
    assert exposure_problem("192.0.2.2", False, False) is not None


def test_the_local_head_gets_token_auth_and_never_an_inherited_cluster_address() -> None:
    env = secure_env({"RAY_ADDRESS": "10.0.0.1:6379", "RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN": "x",
                      "PATH": "/bin"}, "/state/ray_auth_token")
    assert "RAY_ADDRESS" not in env and "RAY_AUTH_TOKEN" not in env and env["PATH"] == "/bin"
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN_PATH"] == "/state/ray_auth_token"
    assert env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"


def test_the_token_is_private_fresh_each_run_and_never_written_through_a_link(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = write_token(str(state))
    assert first == state / TOKEN_FILE and stat.S_IMODE(first.stat().st_mode) == 0o600
    assert stat.S_IMODE(state.stat().st_mode) == 0o700 and len(first.read_text()) == 64
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (state / f"{TOKEN_FILE}.tmp").symlink_to(victim)  # planted where the token is written first
    before = first.read_text()
    second = write_token(str(state))
    assert victim.read_text() == "keep" and not second.is_symlink() and second.read_text() != before


def test_a_state_dir_others_may_write_to_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(ValueError, match="writable by its group or by everyone"):
        write_token(str(shared))
    assert not (shared / TOKEN_FILE).exists()
