"""What the controller needs to know, as plain data (the router layer builds it from its args)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from pools.controller.pinning import Pin

ENGINE_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NCCL_IB_HCA", "UCX_NET_DEVICES", "NCCL_SOCKET_IFNAME")
"""The variables pinning sets, which a replica reports back from its engine's environment."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineLaunch:
    """One replica's engine: everything `python -m pools sim-engine` needs, and where it runs."""

    replica_id: str
    pool: str
    role: str
    model: str
    gpu: str
    tp: int
    node: str
    gpus: tuple[int, ...]
    topology_source: str
    time_scale: float = 1.0
    pin: Pin = field(default_factory=lambda: Pin(node=""))
    generation: int = 0
    """Bumped each time the replica is started somewhere new (a re-placement)."""

    @property
    def actor_name(self) -> str:
        return f"isleserve-{self.replica_id}-g{self.generation}"

    def command(self) -> list[str]:
        placement = json.dumps({"node": self.node, "gpus": list(self.gpus)})
        return ["-m", "pools", "sim-engine", "--model", self.model, "--gpu", self.gpu, "--tp", str(self.tp),
                "--role", self.role, "--port", "0", "--time-scale", str(self.time_scale), "--topology",
                self.topology_source, "--placement", placement, "--engine-id", self.replica_id]

    def environment(self) -> dict[str, str]:
        """What a GPU engine gets from the plan (the simulated one ignores it, but carries it)."""
        return {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in self.gpus), "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                **self.pin.env}
