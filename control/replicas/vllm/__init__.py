"""Real vLLM replicas: the OpenAI server's command line and environment from a replica's plan
(`command`), and the process that runs it (`process`). Imports `pools` (the controller's launch
spec, ports and pinning) and `wire`; never the router."""

from control.replicas.vllm.command import KV_ROLES, VllmServer, command, environment, from_launch, kv_transfer_config
from control.replicas.vllm.process import EngineStartError, VllmProcess, free_port

__all__ = ["KV_ROLES", "EngineStartError", "VllmProcess", "VllmServer", "command", "environment", "free_port",
           "from_launch", "kv_transfer_config"]
