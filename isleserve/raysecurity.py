"""What the Serve application checks and fixes about the Ray it runs in, before it opens anything.

- `check_exposure`: Ray without token authentication lets anyone who reaches one of its ports
  run code (its gRPC services unpickle what they are sent). On a loopback-only node that is the
  machine's users; on a routable address it is the network. So a deployment whose Ray node is
  not on loopback and whose Ray has token authentication off is refused, unless the app's
  `insecure: true` says the operator knows (a private network, a firewall).
- `bind_serve_grpc_to_node`: every Serve replica opens an inter-deployment gRPC server, and Ray
  2.60 binds it to `[::]` (all interfaces) whatever the node's address. This product's
  deployment takes no calls from other deployments, so in this process the server is bound to
  the node's own address instead: 127.0.0.1 on a local run, the routable address on a cluster
  node (where other nodes reach it, with the token). Applied in the replica before Serve starts
  that server; a Ray without the hook (another version) is left as it is, with a warning.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable
from typing import Any

from wire.client import is_loopback

log = logging.getLogger("isleserve.security")
ALL_INTERFACES = "[::]:"


def token_auth_on() -> bool:
    """Ray's token authentication is on in this process (and so in the cluster it joined)."""
    raylet = importlib.import_module("ray._raylet")
    mode, modes = getattr(raylet, "get_authentication_mode", None), getattr(raylet, "AuthenticationMode", None)
    if mode is None or modes is None:  # a Ray without token authentication
        return os.environ.get("RAY_AUTH_MODE", "").lower() == "token"
    return bool(mode() == modes.TOKEN)


def exposure_problem(node_ip: str, auth_on: bool, insecure: bool) -> str | None:
    """Why this deployment must not start (None: it may)."""
    if auth_on or insecure or is_loopback(node_ip.strip("[]")):
        return None
    return (f"Ray's token authentication is off and this Ray node listens on {node_ip}, a non-loopback "
            "address: anyone who reaches a Ray port can run code on it. Start Ray with RAY_AUTH_MODE=token "
            "(and the same RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token on every node and client), or set "
            "`insecure: true` in the application's args to accept the risk")


def check_exposure(insecure: bool) -> None:
    """ValueError (the build fails, `serve status` shows why) when `exposure_problem` finds one."""
    import ray

    node_ip = str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
    problem = exposure_problem(node_ip, token_auth_on(), insecure)
    if problem is not None:
        raise ValueError(problem)
    if insecure and not token_auth_on():
        log.warning("insecure: true: Ray's token authentication is off; anyone reaching a Ray port can run code")


def node_bound(add_port: Callable[[Any, str], int], host: Callable[[], str]) -> Callable[[Any, str], int]:
    """`add_port` with an all-interfaces address replaced by the node's own."""

    def add_port_on_node(server: Any, address: str) -> int:
        if address.startswith(ALL_INTERFACES):
            ip, port = host(), address[len(ALL_INTERFACES):]
            address = f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
        return add_port(server, address)

    add_port_on_node.isle_node_bound = True  # type: ignore[attr-defined]
    return add_port_on_node


def bind_serve_grpc_to_node() -> bool:
    """Serve's replica gRPC server in this process binds to the node's address (True), or Ray has
    no such hook and it stays as Ray binds it (False, logged)."""
    import ray

    try:
        from ray.serve._private import replica as serve_replica
    except ImportError:
        return False
    current = getattr(serve_replica, "add_port_to_grpc_server", None)
    if current is None:
        log.warning("this Ray's Serve replica has no add_port_to_grpc_server: its inter-deployment gRPC port "
                    "keeps Ray's own binding")
        return False
    if not getattr(current, "isle_node_bound", False):
        setattr(serve_replica, "add_port_to_grpc_server",  # noqa: B010 (Ray's name, not ours)
                node_bound(current, lambda: str(ray.util.get_node_ip_address())))  # type: ignore[no-untyped-call]
    return True
