"""What one listener of `wire.http` may hold at once, across all its connections and per
client address: open connections, request bytes buffered in memory (bodies as their bytes
arrive, and what a pipelining client sent ahead), how long a connection may sit idle, and how
long a client may leave its responses unread. Past a cap a client gets 503 with `Retry-After`
and the connection is closed; every refusal is counted by cause (`refused`, which the router's
`/metrics` exports) and logged, at most once per `LOG_EVERY_S`.

Why per client address: a global cap alone is a door one client can lock — 9,900 idle
connections from one address, or a few hundred heads each declaring a large body, used to take
it whole. So a client address (an IPv4 address, an IPv6 /64) may hold only its own share
(`max_client_connections`, `max_client_buffered_bytes`), and body bytes are counted as they
arrive, never reserved from a declared length. When the connection cap is reached, the
connection idle the longest (between requests, nothing buffered) is closed to make room rather
than the new one refused: an idle keep-alive connection costs its client a reconnect, a refused
one costs a request. With none idle, the connection whose request head has been arriving the
longest is closed instead (408), once that head is older than `stalled_head_s`: a real client
sends its head in one go, so a head still incomplete after a second or two is stalled — and
slowloris heads from several addresses (each within its share) used to hold the whole cap for
the read timeout, refusing nearly every request, while costing their sender ~15 KB/s. A head
must also be complete within `head_timeout_s` (408), well before the body's read timeout. A
slow client on a bad link is still served while there is room: only a full server evicts.

Caps are per process (each router worker has its own). The soft fd limit is raised to the hard
limit once per process (`raise_fd_limit`), and the default connection cap is derived from it:
every proxied request needs a second descriptor toward its engine, and some are kept for
listeners, logs and the engines' pooled connections. The per-client caps are off (equal to the
global ones) unless set: an engine's only client is the router, one address.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

log = logging.getLogger("isleserve.http")

FD_RESERVE = 256
"""Descriptors kept out of the connection cap (listeners, logs, Ray, sockets to siblings)."""
MAX_CONNECTIONS = 16384
"""The default cap when the fd limit allows more (per process)."""
MAX_BUFFERED_BYTES = 512 * 1024 * 1024
"""Request bytes held in memory across a listener's connections, by default."""
CLIENT_WRITE_TIMEOUT_S = 60.0
"""A client that reads nothing of its response for this long is disconnected."""
IDLE_TIMEOUT_S = 75.0
"""A keep-alive connection with no request in progress is closed after this long."""
WRITE_BUFFER_BYTES = 64 * 1024
"""Response bytes queued for one client before its source is paused (asyncio's high-water mark)."""
LOG_EVERY_S = 10.0
CLIENT_SHARE = 8
"""The router's default per-client caps: this fraction (1/CLIENT_SHARE) of the global ones, so that
at least CLIENT_SHARE client addresses are needed to fill a cap."""
MIN_CLIENT_CONNECTIONS = 64
HEAD_TIMEOUT_S = 10.0
"""A request head (request line and headers) not complete this long after its first byte: 408."""
STALLED_HEAD_S = 2.0
"""At the connection cap with none idle, a head incomplete for this long may be closed for room."""
CAUSES = ("connections", "client_connections", "idle_evicted", "stalled_head_evicted", "buffered_bytes",
          "client_buffered_bytes", "head_too_large", "body_too_large", "malformed", "head_timeout", "read_timeout",
          "client_timeout", "head_refused")
"""Every cause a refusal or a closure is counted under (a closed set: metric label values)."""


class Evictable(Protocol):
    def evict(self) -> None:
        """Close this connection now, to make room (idle, or its head stalled); it releases its
        count (`release_connection`) before returning."""


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


def client_share(max_connections: int, max_buffered_bytes: int, max_body_bytes: int) -> tuple[int, int]:
    """The router's default per-client caps (connections, buffered bytes) for these global ones
    (`max_connections` 0: derived from the fd limit): 1/CLIENT_SHARE of each, at least
    MIN_CLIENT_CONNECTIONS connections and room for two bodies of `max_body_bytes`."""
    connections = max_connections or default_max_connections(raise_fd_limit())
    return (max(MIN_CLIENT_CONNECTIONS, connections // CLIENT_SHARE),
            max(2 * max_body_bytes, max_buffered_bytes // CLIENT_SHARE))


def client_key(host: str) -> str:
    """The address a per-client cap counts under: an IPv4 address as it is, an IPv6 address by
    its /64 (one host usually has a whole /64), an IPv4-mapped IPv6 address as its IPv4 one."""
    if ":" not in host:
        return host
    try:
        address = ipaddress.IPv6Address(host.partition("%")[0])
    except ValueError:
        return host
    mapped = address.ipv4_mapped
    if mapped is not None:
        return str(mapped)
    return str(ipaddress.IPv6Network((int(address) >> 64 << 64, 64)))


@dataclass(slots=True)
class ServerLimits:
    """The caps of one listener and what its connections hold now, in all and per client
    address (updated by the connections; one event loop, so no lock)."""

    max_connections: int = 0
    """0: derived from the fd limit."""
    max_buffered_bytes: int = MAX_BUFFERED_BYTES
    max_client_connections: int = 0
    """Open connections one client address may hold; 0: no cap of its own (the global one)."""
    max_client_buffered_bytes: int = 0
    """Buffered request bytes one client address may hold; 0: no cap of its own."""
    client_write_timeout_s: float = CLIENT_WRITE_TIMEOUT_S
    idle_timeout_s: float = IDLE_TIMEOUT_S
    head_timeout_s: float = HEAD_TIMEOUT_S
    """A request head must be complete within this long of its first byte (else 408)."""
    stalled_head_s: float = STALLED_HEAD_S
    """At the connection cap with none idle, the oldest head incomplete this long is closed for room."""
    write_buffer_bytes: int = WRITE_BUFFER_BYTES
    connections: int = 0
    buffered_bytes: int = 0
    client_connections: dict[str, int] = field(default_factory=dict)
    """Open connections by client address (only addresses that hold one)."""
    client_bytes: dict[str, int] = field(default_factory=dict)
    """Buffered request bytes by client address (only addresses that hold some)."""
    idle: dict[Evictable, None] = field(default_factory=dict)
    """Connections idle between requests, the longest idle first (evicted first at the cap)."""
    heads: dict[Evictable, float] = field(default_factory=dict)
    """Connections whose request head is arriving, by when it began (`clock`), the oldest first
    (evicted at the cap when none is idle, once older than `stalled_head_s`)."""
    clock: Callable[[], float] = time.monotonic
    refused: dict[str, int] = field(default_factory=dict)
    """Refusals and closures by cause since the start (one of CAUSES)."""
    _unlogged: dict[str, int] = field(default_factory=dict)
    _logged_at: float = 0.0

    def __post_init__(self) -> None:
        if self.max_connections <= 0:
            self.max_connections = default_max_connections(raise_fd_limit())
        if self.max_client_connections <= 0 or self.max_client_connections > self.max_connections:
            self.max_client_connections = self.max_connections
        if self.max_client_buffered_bytes <= 0 or self.max_client_buffered_bytes > self.max_buffered_bytes:
            self.max_client_buffered_bytes = self.max_buffered_bytes

    def admit_connection(self, client: str = "") -> bool:
        """Count a new connection from `client`; False (refusal counted) when a cap is reached.
        At the global cap the longest idle connection is evicted to make room, if there is one."""
        held = self.client_connections.get(client, 0)
        if held >= self.max_client_connections and self.max_client_connections < self.max_connections:
            self.refuse("client_connections")
            return False
        if self.connections >= self.max_connections and not self._make_room():
            self.refuse("connections")
            return False
        self.connections += 1
        self.client_connections[client] = held + 1
        return True

    def _make_room(self) -> bool:
        """Close the longest idle connection, else the longest stalled head; False: neither."""
        if self.idle:
            oldest = next(iter(self.idle))
            del self.idle[oldest]
            cause = "idle_evicted"
        elif self.heads:
            oldest, began = next(iter(self.heads.items()))
            if self.clock() - began < self.stalled_head_s:
                return False  # the oldest head may still be arriving in one go: none is stalled
            del self.heads[oldest]
            cause = "stalled_head_evicted"
        else:
            return False
        self.refuse(cause)
        oldest.evict()  # releases its count (release_connection) before we take it
        return True

    def head_begun(self, connection: Evictable) -> None:
        """A request head has begun to arrive on `connection` (a counted one)."""
        self.heads[connection] = self.clock()

    def head_over(self, connection: Evictable) -> None:
        """The head is complete, refused or its connection closing: no longer evictable as one."""
        self.heads.pop(connection, None)

    def release_connection(self, client: str = "") -> None:
        self.connections -= 1
        left = self.client_connections.get(client, 0) - 1
        if left > 0:
            self.client_connections[client] = left
        else:
            self.client_connections.pop(client, None)

    def take(self, client: str, more_bytes: int) -> str:
        """Count `more_bytes` buffered for `client` if both caps allow: "" when taken, else the
        cause of the refusal (counted)."""
        held = self.client_bytes.get(client, 0)
        if (held + more_bytes > self.max_client_buffered_bytes
                and self.max_client_buffered_bytes < self.max_buffered_bytes):
            cause = "client_buffered_bytes"
        elif self.buffered_bytes + more_bytes > self.max_buffered_bytes:
            cause = "buffered_bytes"
        else:
            self.add_bytes(client, more_bytes)
            return ""
        self.refuse(cause)
        return cause

    def add_bytes(self, client: str, delta: int) -> None:
        """Count `delta` more (or fewer) buffered bytes for `client`, with no check."""
        self.buffered_bytes += delta
        left = self.client_bytes.get(client, 0) + delta
        if left > 0:
            self.client_bytes[client] = left
        else:
            self.client_bytes.pop(client, None)

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
                        "%.1f MiB buffered, %d client addresses)", said, self.max_connections,
                        self.max_buffered_bytes >> 20, self.connections, self.buffered_bytes / (1 << 20),
                        len(self.client_connections))

    def view(self) -> dict[str, object]:
        """What the front door holds now and has refused so far (JSON: the router's /metrics)."""
        return {"refused": dict(self.refused), "connections": self.connections, "buffered_bytes": self.buffered_bytes}

    def describe(self) -> str:
        return (f"at most {self.max_connections} connections (fd limit {raise_fd_limit()}), "
                f"{self.max_client_connections} per client address, "
                f"{self.max_buffered_bytes >> 20} MiB of buffered request bytes "
                f"({self.max_client_buffered_bytes >> 20} MiB per client address), idle connections closed after "
                f"{self.idle_timeout_s:g} s, clients that read nothing for {self.client_write_timeout_s:g} s "
                f"disconnected")
