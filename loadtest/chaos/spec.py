"""The chaos run's settings (`configs/chaos.yaml`): which deployment, how it is spread over Ray
nodes, how hard it is driven, and the faults, in order.

The timeline is a sequence, not a clock: a quiet window, then each fault in turn, each followed
by a quiet window once the deployment has recovered from it (a replica restarted, a replacement
serving, a burst over). Recovery takes what it takes (Ray notices a lost node after about 15 s by
default), so faults never overlap and every fault has its own before, during and after.

    ChaosSpec.window_s        the quiet windows (and the before/after windows of the report)
    faults[].kind             replica_crash | link_degrade | node_loss | overload
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from topology.configfile import load_yaml_file, validate_mapping


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ReplicaCrash(_Strict):
    kind: Literal["replica_crash"]
    replica: str = Field(description="its engine process is killed (SIGKILL) while it has streams open")
    min_streams: int = Field(default=2, ge=1, description="wait until the router has this many requests on it")


class LinkDegrade(_Strict):
    kind: Literal["link_degrade"]
    replica: str = Field(description="the NVLink between the first two GPUs of its TP group degrades")
    bandwidth_factor: float = Field(default=0.05, gt=0, le=1, description="bandwidth the link keeps (the engine "
                                    "slows by the cost model)")
    detect_after_s: float = Field(default=5.0, ge=0, description="then the link is marked unhealthy (python -m "
                                  "pools mark-link), as a health check that noticed it would")


class NodeLoss(_Strict):
    kind: Literal["node_loss"]
    node: str = Field(description="a simulated node carried by a Ray node of its own (ray_nodes): every process "
                      "of that Ray node is killed")


class Overload(_Strict):
    kind: Literal["overload"]
    factor: float = Field(default=3.0, gt=1, description="offered load during the burst, times the base load")
    duration_s: float = Field(default=10.0, gt=0)


Fault = Annotated[ReplicaCrash | LinkDegrade | NodeLoss | Overload, Field(discriminator="kind")]


class WorkloadShape(_Strict):
    prompt: int | str = Field(default="lognormal:600:400:4000", description="prompt tokens (a length "
                              "distribution: N, uniform:LOW:HIGH or lognormal:MEAN:MEDIAN[:MAX])")
    output: int | str = Field(default="uniform:16:64", description="max_tokens (ignore_eos: every token comes)")
    class_mix: dict[str, float] = Field(default_factory=lambda: {"interactive": 0.3, "standard": 0.4, "batch": 0.3})
    seed: int = 0

    @model_validator(mode="after")
    def _mix(self) -> WorkloadShape:
        if not self.class_mix or any(w < 0 for w in self.class_mix.values()) or sum(self.class_mix.values()) <= 0:
            raise ValueError(f"class_mix {self.class_mix} needs weights >= 0 with a positive sum")
        return self


class ChaosSpec(_Strict):
    base_config: str = Field(default="local.yaml", description="the Serve config deployed (relative to this file)")
    time_scale: float = Field(default=5.0, gt=0, description="engines' wall seconds per modelled second (the "
                              "deployment's own capacity, not this machine's CPU, sets the pace)")
    load: float = Field(default=0.8, gt=0, le=2, description="base offered load, a fraction of capacity")
    capacity_rps: float | None = Field(default=None, gt=0, description="the deployment's capacity in modelled "
                                       "req/s; unset: estimated by the simulator on the deployed plan")
    head_node: str | None = Field(default=None, description="the simulated node the Ray head carries")
    ray_nodes: list[str] = Field(default_factory=list, description="simulated nodes carried by a Ray node each")
    workload: WorkloadShape = Field(default_factory=WorkloadShape)
    window_s: float = Field(default=15.0, gt=0, description="quiet windows, and the report's before/after windows")
    request_deadline_s: float = Field(default=120.0, gt=0, description="wall seconds: no answer by then is hung")
    recover_timeout_s: float = Field(default=90.0, gt=0, description="a fault not recovered by then is reported "
                                     "as such and the run goes on")
    router_port: int | None = Field(default=None, ge=1, le=65535, description="the router's port on 127.0.0.1 "
                                    "(unset: a free one, so a run never meets another deployment on 8000)")
    faults: list[Fault] = Field(min_length=1)

    @model_validator(mode="after")
    def _nodes(self) -> ChaosSpec:
        carried = ([self.head_node] if self.head_node else []) + self.ray_nodes
        if len(set(carried)) != len(carried):
            raise ValueError(f"a simulated node is carried once: head_node {self.head_node}, ray_nodes "
                             f"{self.ray_nodes}")
        for f in self.faults:
            if isinstance(f, NodeLoss) and f.node not in self.ray_nodes:
                raise ValueError(f"node_loss {f.node}: only a node in ray_nodes {self.ray_nodes} can be lost "
                                 "(the head carries the router and the controller)")
        return self

    def scaled(self, k: float) -> ChaosSpec:
        """Every window and fault duration times `k` (a shorter run for tests); Ray's own
        detection times do not scale."""
        faults: list[Fault] = []
        for f in self.faults:
            if isinstance(f, LinkDegrade):
                faults.append(f.model_copy(update={"detect_after_s": f.detect_after_s * k}))
            elif isinstance(f, Overload):
                faults.append(f.model_copy(update={"duration_s": f.duration_s * k}))
            else:
                faults.append(f)
        return self.model_copy(update={"window_s": self.window_s * k, "faults": faults})


def load_chaos_spec(path: str | Path) -> tuple[ChaosSpec, Path]:
    """The spec and the base Serve config's path (resolved next to the spec file)."""
    where = str(path)
    spec = validate_mapping(ChaosSpec, load_yaml_file(where, "chaos spec"), "chaos spec",
                            "a chaos spec is a mapping with `faults`", where)
    base = Path(spec.base_config)
    return spec, base if base.is_absolute() else Path(where).resolve().parent / base
