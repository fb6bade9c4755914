"""A planned vLLM replica's server, from the controller's launch (`server_for`, pure) and, on its
node, the replica that runs it (`replica_for`: there the node's address and the model directory
are known).

The server listens on the node's cluster address (the router may run on another node) at the
HTTP port the controller gave it on that node; prefill and decode replicas get their NIXL
side-channel port the same way. On the CPU backend (`cpu_backend`) each TP rank's OpenMP threads
are bound to the CPUs of the GPU it stands in for (`VLLM_CPU_OMP_THREADS_BIND`, one list per rank).
"""

from __future__ import annotations

import sys
from pathlib import Path

from control.replicas.vllm.command import VllmServer, from_launch
from control.replicas.vllm.replica import VllmReplica
from control.spec import EngineLaunch
from wire.openai import API_KEY_ENV


def cpu_threads_bind(gpu_cpus: tuple[str, ...], tp: int) -> str | None:
    """One CPU list per TP rank, '|'-separated; None (vLLM's own `auto`) when any is unknown."""
    if len(gpu_cpus) != tp or not all(gpu_cpus):
        return None
    return "|".join(gpu_cpus)


def server_for(launch: EngineLaunch, host_ip: str, offline: bool = False) -> VllmServer:
    if launch.vllm is None:
        raise ValueError(f"replica {launch.replica_id}: not a vLLM replica")
    s, ports = launch.vllm.settings, launch.vllm.ports
    return from_launch(launch, model=s.model, port=ports.http, side_channel_port=ports.side_channel,
                       served_model_name=s.served_model_name, host_ip=host_ip, host=host_ip,
                       max_model_len=s.max_model_len, dtype=s.dtype, extra_args=(*s.extra_args, *launch.kv_events),
                       extra_env={**s.extra_env, **({API_KEY_ENV: launch.api_key} if launch.api_key else {})},
                       offline=offline,
                       cpu_threads_bind=cpu_threads_bind(launch.vllm.gpu_cpus, launch.tp) if s.cpu_backend else None)


def replica_for(launch: EngineLaunch, host_ip: str, die_with_starter: bool = False) -> VllmReplica:
    """Runs on the replica's node: a model directory there means no Hugging Face hub at all.
    `die_with_starter`: see VllmProcess (a replica actor sets it)."""
    assert launch.vllm is not None
    s = launch.vllm.settings
    server = server_for(launch, host_ip, offline=Path(s.model).is_dir())
    return VllmReplica(server, s.python or sys.executable, log_dir=s.log_dir, ready_timeout_s=s.start_timeout_s,
                       node=launch.node, generation=launch.generation, die_with_starter=die_with_starter)
