"""Every listening TCP socket of a process tree, read from /proc (no tools), and probes that tell
what an unauthenticated caller gets from each: an HTTP answer, a gRPC status, or nothing.

A gRPC port is probed with one call per service Ray and Serve define (their generated protobuf
modules): a service the port does not serve answers UNIMPLEMENTED, one it serves must answer
UNAUTHENTICATED (Ray's token interceptor); any other status means the call reached the service
without a token."""

from __future__ import annotations

import importlib
import os
import pkgutil
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

from wire.client import is_loopback

LISTEN = "0A"


@dataclass(frozen=True, slots=True)
class Listener:
    host: str
    port: int
    pid: int
    command: str

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)


def _address(field: str, v6: bool) -> tuple[str, int]:
    hex_ip, hex_port = field.split(":")
    raw = bytes.fromhex(hex_ip)
    if v6:  # four host-order 32-bit words
        raw = b"".join(struct.pack("<I", struct.unpack(">I", raw[i:i + 4])[0]) for i in range(0, 16, 4))
        return socket.inet_ntop(socket.AF_INET6, raw), int(hex_port, 16)
    return socket.inet_ntop(socket.AF_INET, raw[::-1]), int(hex_port, 16)


def _listening_inodes() -> dict[str, tuple[str, int]]:
    found: dict[str, tuple[str, int]] = {}
    for table, v6 in (("tcp", False), ("tcp6", True)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == LISTEN:
                found[fields[9]] = _address(fields[1], v6)
    return found


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, session id)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), int(fields[3])


def process_tree(root: int) -> set[int]:
    """`root`, everything descended from it, and everything in its session."""
    parents: dict[int, int] = {}
    members = {root}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None:
                parents[int(entry)] = stat[0]
                if stat[1] == root:
                    members.add(int(entry))
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in members and pid not in members:
                members.add(pid)
                grew = True
    return members


def listeners(pids: set[int]) -> list[Listener]:
    inodes = _listening_inodes()
    out = []
    for pid in sorted(pids):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                host, port = inodes[target[8:-1]]
                out.append(Listener(host, port, pid, command.strip()))
    return sorted(set(out), key=lambda x: (x.port, x.pid))


def http_answer(port: int, method: str = "GET", path: str = "/", headers: str = "") -> tuple[int, bytes] | None:
    """(status, body start) of one HTTP/1.1 request, or None: not an HTTP server."""
    with socket.create_connection(("127.0.0.1", port), timeout=3) as sock:
        sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n{headers}"
                     "Connection: close\r\n\r\n".encode())
        data = b""
        try:
            while len(data) < 4096:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
    if not data.startswith(b"HTTP/1."):
        return None
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body[:200]


def ray_services() -> dict[str, str]:
    """Every gRPC service Ray and Serve define -> one method of it to call (a read-only one where
    its name says so)."""
    services: dict[str, str] = {}
    for package in ("ray.core.generated", "ray.serve.generated"):
        root = importlib.import_module(package)
        for info in pkgutil.iter_modules(root.__path__):
            if not info.name.endswith("_pb2"):
                continue
            try:
                module = importlib.import_module(f"{package}.{info.name}")
            except Exception:  # a module for an optional part of Ray
                continue
            for service in module.DESCRIPTOR.services_by_name.values():
                methods = [m.name for m in service.methods]
                reads = [m for m in methods if m.startswith(("Get", "List"))]
                services[service.full_name] = (reads or methods)[0]
    services.setdefault("ray.rpc.ObjectManagerService", "Pull")  # the raylet's object manager: C++ only
    return services


def grpc_statuses(port: int, services: dict[str, str]) -> dict[str, str]:
    """Service -> the status code name an unauthenticated call to it got on this port."""
    import grpc  # type: ignore[import-untyped]

    out: dict[str, str] = {}
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        for service, method in services.items():
            call = channel.unary_unary(f"/{service}/{method}", request_serializer=lambda b: b,
                                       response_deserializer=lambda b: b)
            try:
                call(b"", timeout=3)
                out[service] = "OK"
            except grpc.RpcError as err:
                out[service] = err.code().name
    return out
