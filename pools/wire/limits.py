"""What one listener of `pools.wire.http` may hold at once, across all its connections: open
connections, request bytes buffered in memory (bodies being received or handled, and what a
pipelining client sent ahead), and how long a client may leave its responses unread. Past a cap
a client gets 503 with `Retry-After` and the connection is closed; the refusals are counted and
logged, at most once per `LOG_EVERY_S`.

Caps are per process (each router worker has its own). The soft fd limit is raised to the hard
limit once per process (`raise_fd_limit`), and the default connection cap is derived from it:
every proxied request needs a second descriptor toward its engine, and some are kept for
listeners, logs and the engines' pooled connections.
"""

from __future__ import annotations

import functools
import logging
import resource
import time
from dataclasses import dataclass, field

log = logging.getLogger("isleserve.http")

FD_RESERVE = 256
"""Descriptors kept out of the connection cap (listeners, logs, Ray, sockets to siblings)."""
MAX_CONNECTIONS = 16384
"""The default cap when the fd limit allows more (per process)."""
MAX_BUFFERED_BYTES = 512 * 1024 * 1024
"""Request bytes held in memory across a listener's connections, by default."""
CLIENT_WRITE_TIMEOUT_S = 60.0
"""A client that reads nothing of its response for this long is disconnected."""
WRITE_BUFFER_BYTES = 64 * 1024
"""Response bytes queued for one client before its source is paused (asyncio's high-water mark)."""
LOG_EVERY_S = 10.0

@functools.cache
def raise_fd_limit() -> int:
    """Raise the soft limit on open files to the hard limit (once per process); the limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if want > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return soft


def default_max_connections(fd_limit: int) -> int:
    """Half the descriptors left after the reserve (a client connection may need an upstream one)."""
    return max(16, min(MAX_CONNECTIONS, (fd_limit - FD_RESERVE) // 2))


@dataclass(slots=True)
class ServerLimits:
    """The caps of one listener and what its connections hold now (updated by the connections;
    one event loop, so no lock)."""

    max_connections: int = 0
    """0: derived from the fd limit."""
    max_buffered_bytes: int = MAX_BUFFERED_BYTES
    client_write_timeout_s: float = CLIENT_WRITE_TIMEOUT_S
    write_buffer_bytes: int = WRITE_BUFFER_BYTES
    connections: int = 0
    buffered_bytes: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    """Refusals by cause since the start (`connections`, `buffered_bytes`, `client_timeout`)."""
    _unlogged: dict[str, int] = field(default_factory=dict)
    _logged_at: float = 0.0

    def __post_init__(self) -> None:
        if self.max_connections <= 0:
            self.max_connections = default_max_connections(raise_fd_limit())

    def admit_connection(self) -> bool:
        if self.connections >= self.max_connections:
            self.refuse("connections")
            return False
        self.connections += 1
        return True

    def fits(self, more_bytes: int) -> bool:
        return self.buffered_bytes + more_bytes <= self.max_buffered_bytes

    def refuse(self, cause: str) -> None:
        """Count one refusal; log what was refused since the last line, at most every LOG_EVERY_S."""
        self.refused[cause] = self.refused.get(cause, 0) + 1
        self._unlogged[cause] = self._unlogged.get(cause, 0) + 1
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY_S:
            self._logged_at = now
            said = ", ".join(f"{n} x {c}" for c, n in sorted(self._unlogged.items()))
            self._unlogged.clear()
            log.warning("front door: refused or closed %s (caps: %d connections, %d MiB buffered; now %d open, "
                        "%.1f MiB buffered)", said, self.max_connections, self.max_buffered_bytes >> 20,
                        self.connections, self.buffered_bytes / (1 << 20))

    def describe(self) -> str:
        return (f"at most {self.max_connections} connections (fd limit {raise_fd_limit()}), "
                f"{self.max_buffered_bytes >> 20} MiB of buffered request bytes, clients that read nothing for "
                f"{self.client_write_timeout_s:g} s disconnected")
