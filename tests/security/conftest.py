"""One real router (`python -m router --config`, debug logging to a file) on loopback in front
of simulated engines (a mixed replica and a prefill/decode pair), with small limits so that bad
input hits them fast, and a canary listener that no request may ever make anything connect to."""

from __future__ import annotations

import json
import socket
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from router.config import sha256
from tests.conftest import ROOT
from tests.support.engines import ROUTER_READY_S, EngineProcess, start_engine, stop_engine
from wire.processes import ChildError, ReadyLine
from wire.supervisor import Child

MODEL = "llama-3.1-8b"
USER_KEY = "sk-isle-test-user-7f3c9a1e5b"
BATCH_KEY = "sk-isle-test-batch-2d8e4f6a0c"
ADMIN_KEY = "sk-isle-test-admin-9b1d3f5e7a"
KEYS = (USER_KEY, BATCH_KEY, ADMIN_KEY)
MAX_BODY_BYTES = 64 * 1024
MAX_TOKENS_LIMIT = 4096
READ_TIMEOUT_S = 0.5
LONG = "a prompt long enough for the prefill/decode pair " * 40


@dataclass
class Canary:
    """A loopback listener standing for an address a client would like the deployment to reach."""
    sock: socket.socket
    hits: list[bytes] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.settimeout(1.0)
            try:
                self.hits.append(conn.recv(4096))
            except OSError:
                self.hits.append(b"")
            conn.close()


@dataclass
class Deployment:
    base: str
    host: str
    port: int
    log_path: Path
    proc: Child
    canary: Canary
    engines: dict[str, EngineProcess] = field(default_factory=dict)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def call(url: str, body: bytes | None = None, key: str | None = USER_KEY, headers: dict[str, str] | None = None,
         method: str | None = None, timeout_s: float = 30.0) -> tuple[int, dict[str, str], bytes]:
    """One HTTP request; the status, lower-case headers and body, errors included."""
    head = {"content-type": "application/json", **({"authorization": f"Bearer {key}"} if key else {}),
            **(headers or {})}
    request = urllib.request.Request(url, data=body, headers=head, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}, err.read()


def assert_openai_error(status: int, body: bytes, expected: int | tuple[int, ...]) -> dict[str, object]:
    wanted = (expected,) if isinstance(expected, int) else expected
    assert status in wanted, (status, body[:300])
    error = json.loads(body)["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["code"] == status
    return dict(error)


def _router_config(engines: dict[str, EngineProcess], roles: dict[str, str]) -> dict[str, object]:
    return {
        "host": "127.0.0.1", "port": 0, "require_keys": True,
        "keys": [{"tenant": "dev", "key_sha256": sha256(USER_KEY)},
                 {"tenant": "batchy", "key_sha256": sha256(BATCH_KEY), "slo_classes": ["batch"]}],
        "admin_keys": [{"tenant": "ops", "key_sha256": sha256(ADMIN_KEY)}],
        "slo_classes": [
            {"name": "interactive", "priority": 0, "ttft_ms": 500, "tpot_ms": 50},
            {"name": "standard", "priority": 1, "ttft_ms": 2000, "tpot_ms": 100},
            {"name": "batch", "priority": 2, "ttft_ms": 30000, "tpot_ms": 500, "sheddable": True}],
        "default_slo_class": "standard",
        "pd": {"enabled": True, "min_prompt_tokens": 200},
        "upstream": {"request_timeout_s": 20, "first_byte_timeout_s": 20, "idle_timeout_s": 20},
        "max_body_bytes": MAX_BODY_BYTES, "max_tokens_limit": MAX_TOKENS_LIMIT, "read_timeout_s": READ_TIMEOUT_S,
        "topology": "configs/clusters/local-sim.yaml",
        "replicas": [{"replica_id": name, "url": engines[name].base, "model": MODEL, "role": role, "node": "h100-0",
                      "gpus": [i], "gpu_model": "h100-sxm", "catalog_model": MODEL}
                     for i, (name, role) in enumerate(roles.items())],
    }


@pytest.fixture(scope="session")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    roles = {"m1": "mixed", "p1": "prefill", "d1": "decode"}
    engines: dict[str, EngineProcess] = {}
    sock = socket.create_server(("127.0.0.1", 0))
    canary = Canary(sock)
    threading.Thread(target=canary.serve, daemon=True).start()
    proc: Child | None = None
    try:
        for i, (name, role) in enumerate(roles.items()):
            engines[name] = start_engine(
                "--model", MODEL, "--gpu", "h100-sxm", "--time-scale", "0.001", "--topology",
                "configs/clusters/local-sim.yaml", "--role", role, "--engine-id", name,
                "--placement", json.dumps({"node": "h100-0", "gpus": [i]}))
        folder = tmp_path_factory.mktemp("secure-router")
        path, log_path = folder / "router.yaml", folder / "router.log"
        path.write_text(yaml.safe_dump(_router_config(engines, roles)))
        proc = Child([sys.executable, "-m", "router", "--config", str(path), "--log-level", "debug"], name="router",
                     ready=ReadyLine("ready:"), cwd=ROOT, stderr=log_path).start()  # it writes its log itself
        try:
            line = proc.wait_ready(ROUTER_READY_S)
        except ChildError:
            raise AssertionError(log_path.read_text()) from None
        base = line.split("ready:")[1].strip().removesuffix("/v1")
        host, port = base.removeprefix("http://").rsplit(":", 1)
        yield Deployment(base=base, host=host, port=int(port), log_path=log_path, proc=proc, canary=canary,
                         engines=engines)
        assert proc.poll() is None, "the router died during the tests"
    finally:
        if proc is not None:
            proc.stop()
        sock.close()
        for engine in engines.values():
            stop_engine(engine)


def rss_mib(*pids: int) -> float:
    """The resident memory of these processes together, in MiB."""
    total = 0
    for pid in pids:
        line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmRSS:"))
        total += int(line.split()[1])
    return total / 1024


def open_fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def _socket_ports(pid: int) -> dict[str, tuple[int, int]]:
    """inode -> (local port, remote port) of every TCP socket in the process's network namespace."""
    ports: dict[str, tuple[int, int]] = {}
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            cols = line.split()
            local, remote, inode = cols[1], cols[2], cols[9]
            ports[inode] = (int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16))
    return ports


def fds_held(pid: int, engine_ports: set[int]) -> tuple[int, int]:
    """(descriptors other than connections to the engines, connections to the engines).
    The router keeps idle keep-alive connections to each engine (bounded per engine), and how
    many are left idle depends on how many requests overlapped, so a leak check on the clients'
    side counts them apart."""
    ports = _socket_ports(pid)
    other = upstream = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().name
        except OSError:
            continue  # closed while listing
        inode = target.removeprefix("socket:[").removesuffix("]") if target.startswith("socket:[") else ""
        if inode in ports and ports[inode][1] in engine_ports:
            upstream += 1
        else:
            other += 1
    return other, upstream


def engine_ports(engines: dict[str, EngineProcess]) -> set[int]:
    return {int(e.base.rsplit(":", 1)[1]) for e in engines.values()}


def engine_state(engine: EngineProcess) -> tuple[float, float]:
    """(requests running, KV cache usage) as the engine exports them."""
    with urllib.request.urlopen(f"{engine.base}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    values = {}
    for line in text.splitlines():
        for name in ("vllm:num_requests_running", "vllm:kv_cache_usage_perc"):
            if line.startswith(name):
                values[name] = float(line.rsplit(" ", 1)[1])
    return values["vllm:num_requests_running"], values["vllm:kv_cache_usage_perc"]
