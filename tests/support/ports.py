"""Free TCP ports on loopback, for servers a test starts (each asked of the kernel, then released:
another process could take one in between, which no test here has seen)."""

from __future__ import annotations

import socket


def free_ports(n: int = 1) -> list[int]:
    """`n` distinct free ports on 127.0.0.1 (held together while chosen, so never the same)."""
    held = []
    try:
        for _ in range(n):
            s = socket.socket()
            held.append(s)
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()
