"""What the controller needs to know, as plain data (the router layer builds it from its args)."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineLaunch:
    """One replica's engine: everything `python -m pools sim-engine` needs."""

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

    def command(self) -> list[str]:
        placement = json.dumps({"node": self.node, "gpus": list(self.gpus)})
        return ["-m", "pools", "sim-engine", "--model", self.model, "--gpu", self.gpu, "--tp", str(self.tp),
                "--role", self.role, "--port", "0", "--time-scale", str(self.time_scale), "--topology",
                self.topology_source, "--placement", placement, "--engine-id", self.replica_id]

    def environment(self) -> dict[str, str]:
        """What a GPU engine would get from the plan (the simulated one ignores it)."""
        return {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in self.gpus), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
