"""The chaos run's settings (`configs/chaos.yaml`): which deployment, how it is spread over Ray
nodes, how hard it is driven, and the faults, in order.

The timeline is a sequence, not a clock: a warm-up under load (optional), a quiet window, then each
fault in turn, each followed by a quiet window once the deployment has recovered from it (a
replica restarted, a replacement serving, a burst over). Recovery takes what it takes (Ray
notices a lost node after about 15 s by default), so faults never overlap and every fault has its
own before, during and after. (A KV fault may last until the end of the run: the faults after it
meet its pair avoided.)

    ChaosSpec.window_s        the quiet windows (and the before/after windows of the report)
    faults[].kind             replica_crash | link_degrade | node_loss | overload |
                              kv_transport_fallback | kv_remote_nic (one prefill->decode pair's KV
                              path, `loadtest.chaos.kvfaults`)
"""

from __future__ import annotations

from collections.abc import Mapping
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


class _KvPairFault(_Strict):
    decode: str = Field(description="the decode replica whose engine reads the KV (its /admin/faults takes the fault)")
    prefill: str = Field(description="the prefill replica the KV comes from: only this pair is hit")
    duration_s: float | None = Field(default=None, gt=0, description="lifted this long after it struck; unset: at "
                                     "the end of the run")
    watch_s: float = Field(default=60.0, gt=0, description="wall seconds the run waits for the router to flag the "
                           "pair and stop choosing it (the router's own clock: not scaled)")

    @model_validator(mode="after")
    def _pair(self) -> _KvPairFault:
        if self.decode == self.prefill:
            raise ValueError(f"decode and prefill name one replica ({self.decode}): a pair is two replicas")
        return self

    @property
    def pair(self) -> str:
        """As the router names it (`/admin/replicas` kv_paths, isle_kv_pair_verdict)."""
        return f"{self.prefill}->{self.decode}"


class KvTransportFallback(_KvPairFault):
    kind: Literal["kv_transport_fallback"]


class KvRemoteNic(_KvPairFault):
    kind: Literal["kv_remote_nic"]
    bandwidth_factor: float = Field(default=0.5, gt=0, lt=1, description="the share of the pair's KV rate left "
                                    "(0.5: NIXL took the NIC on the other socket)")


KvFault = KvTransportFallback | KvRemoteNic
Fault = Annotated[ReplicaCrash | LinkDegrade | NodeLoss | Overload | KvTransportFallback | KvRemoteNic,
                  Field(discriminator="kind")]


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
    warmup_s: float = Field(default=0.0, ge=0, description="wall seconds under load before the first quiet window, "
                            "in no window of the report (queues reach their steady state; not scaled)")
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
        pairs = [f.pair for f in self.faults if isinstance(f, KvTransportFallback | KvRemoteNic)]
        if len(set(pairs)) != len(pairs):
            raise ValueError(f"KV faults on pairs {pairs}: one fault per pair (the second would overwrite the first's "
                             "engine setting)")
        return self

    def scaled(self, k: float) -> ChaosSpec:
        """Every window and fault duration times `k` (a shorter run for tests); Ray's own
        detection times and the router's KV-path clock (`watch_s`) do not scale."""
        faults: list[Fault] = []
        for f in self.faults:
            if isinstance(f, LinkDegrade):
                faults.append(f.model_copy(update={"detect_after_s": f.detect_after_s * k}))
            elif isinstance(f, Overload | KvTransportFallback | KvRemoteNic) and f.duration_s is not None:
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


def kv_pair_problems(faults: list[Fault], roles: Mapping[str, str]) -> list[str]:
    """What is wrong with the KV faults' pairs in a deployment whose replicas have these roles
    (replica id -> prefill|decode|mixed), every problem at once."""
    problems = []
    for i, f in enumerate(faults):
        if not isinstance(f, KvTransportFallback | KvRemoteNic):
            continue
        for side, name, want in (("decode", f.decode, "decode"), ("prefill", f.prefill, "prefill")):
            of_role = sorted(r for r, role in roles.items() if role == want)
            if roles.get(name) != want:
                problems.append(f"faults[{i}] ({f.kind}).{side}: {name!r} is not a {want} replica of the base config "
                                f"(its {want} replicas: {', '.join(of_role) or 'none'})")
    return problems
