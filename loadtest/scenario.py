"""Scenarios (`configs/scenarios/*.yaml`): a topology (any source: a capture, NCCL XML, a cluster
spec or a machine template, relative to the scenario file), pools, SLO classes, a workload,
the rates to try, the placement policies to compare, routing, faults on a timeline, and GPUs
already held by other work (the end state of replica churn, which index-order placement has to
fit around)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from loadtest.sim.model import Fault
from pools.config import AutoscalingPoolConfig, PoolConfig, SLOClassConfig
from pools.model import DEFAULT_SLO_CLASSES, PoolSpec, SLOClass
from router.config import PDConfig, ProfileConfig
from router.plugins.profile import Profile, check_profile
from topology import GpuRef, Topology, read_source
from topology.configfile import load_yaml_file, validate_mapping


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FaultConfig(_Strict):
    at_s: float = Field(ge=0)
    kind: Literal["link_degrade", "link_restore", "node_loss", "kv_transport_fallback", "kv_remote_nic", "kv_restore"]
    node: str = Field(default="", description="link and node faults: the node")
    gpus: list[int] = Field(default_factory=list, description="the link's two GPUs; empty: every link of the node")
    factor: float = Field(default=0.25, gt=0, le=1, description="bandwidth left on a degraded link; kv_remote_nic: "
                          "the KV rate left (0.5: the NIC on the other socket)")
    pair: list[str] = Field(default_factory=list, description="kv_* faults: the prefill and decode replica ids")

    @model_validator(mode="after")
    def _target(self) -> FaultConfig:
        if self.kind.startswith("kv_") and len(self.pair) != 2:
            raise ValueError(f"{self.kind} needs pair: [prefill replica, decode replica]")
        if not self.kind.startswith("kv_") and not self.node:
            raise ValueError(f"{self.kind} needs node")
        return self


class HeldConfig(_Strict):
    node: str
    gpus: list[int] = Field(min_length=1)


class RoutingConfig(_Strict):
    default_profile: ProfileConfig = ProfileConfig()
    profiles: dict[str, ProfileConfig] = Field(default_factory=dict)
    pd: PDConfig = PDConfig()
    scrape_interval_s: float = Field(default=0.5, gt=0)


class AutoscaleScenarioConfig(_Strict):
    pools: dict[str, AutoscalingPoolConfig] = Field(min_length=1)
    interval_s: float = Field(default=5.0, gt=0)
    startup_s: float = Field(default=30.0, ge=0, description="decision to serving (weights load, engine start)")
    window_s: float = Field(default=30.0, gt=0)
    look_back_s: float = Field(default=30.0, gt=0, description="load and rate averaged over this long")
    autoscalers: list[str] = Field(default_factory=lambda: ["static", "blind", "topology"])


class ScenarioConfig(_Strict):
    name: str
    description: str = ""
    topology: str = Field(description="any topology source; relative paths are relative to the scenario file")
    gpu: str | None = Field(default=None, description="catalogue GPU for GPUs whose model the source does not say")
    model: str | None = Field(default=None, description="served model requests ask for (default: the first pool's)")
    pools: list[PoolConfig] = Field(min_length=1)
    slo_classes: list[SLOClassConfig] = Field(default_factory=list)
    workload: dict[str, Any] = Field(description="passed to loadtest.workload.load_workload")
    rates: list[float] = Field(default_factory=lambda: [1.0], min_length=1,
                               description="multipliers of the workload's arrival rate")
    policies: list[str] = Field(default_factory=lambda: ["island-aligned", "ray-pack"], min_length=1)
    routing: RoutingConfig = RoutingConfig()
    faults: list[FaultConfig] = Field(default_factory=list)
    held: list[HeldConfig] = Field(default_factory=list, description="GPUs other work holds (replica churn)")
    seed: int = 0
    detect_s: float = Field(default=2.0, gt=0, description="health loop: link fault to drain")
    expert_policy: str | list[str] | None = Field(
        default=None, description="EP gangs' expert placement: topology, eplb or linear (a list: compare them)")
    expert_load: str = Field(default="zipf:1.3", description="expert load: a load file or zipf:SKEW[:SEED]")
    redundant_experts: int = Field(default=0, ge=0, description="redundant experts per EP gang ((E + R) % EP == 0)")
    expert_locality: bool | list[bool] = Field(
        default=True, description="a token uses a copy of an expert in its own NVLink domain (the isleserve vLLM "
        "plugin); false: any copy (vLLM's own choice); a list: compare them")
    autoscaling: AutoscaleScenarioConfig | None = None

    def expert_policies(self) -> list[str | None]:
        if self.expert_policy is None:
            return [None]
        return [self.expert_policy] if isinstance(self.expert_policy, str) else list(self.expert_policy)

    def expert_localities(self) -> list[bool]:
        return [self.expert_locality] if isinstance(self.expert_locality, bool) else list(self.expert_locality)


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    config: ScenarioConfig
    path: Path
    topology: Topology
    topology_source: str

    @property
    def name(self) -> str:
        return self.config.name

    def pools(self) -> tuple[PoolSpec, ...]:
        auto = [p.name for p in self.config.pools if p.replicas == "auto"]
        if auto:
            raise ValueError(f"{self.path}: pools {auto} say `replicas: auto`; a scenario compares policies on "
                             "fixed counts (size them first: python -m pools size)")
        return tuple(p.spec(int(p.replicas)) for p in self.config.pools)

    def classes(self) -> dict[str, SLOClass]:
        chosen = [c.to_slo() for c in self.config.slo_classes] or list(DEFAULT_SLO_CLASSES)
        return {c.name: c for c in chosen}

    def profiles(self) -> dict[str, Profile]:
        def profile(p: ProfileConfig) -> Profile:
            out = Profile(filters=tuple(p.filters), scorers=dict(p.scorers), picker=p.picker)
            check_profile(out)
            return out

        routing = self.config.routing
        return {name: profile(routing.profiles.get(name, routing.default_profile)) for name in self.classes()}

    def faults(self) -> tuple[Fault, ...]:
        return tuple(Fault(at_s=f.at_s, kind=f.kind, node=f.node, gpus=tuple(f.gpus), factor=f.factor,
                           pair=tuple(f.pair))
                     for f in self.config.faults)

    def held(self) -> frozenset[GpuRef]:
        return frozenset(GpuRef(h.node, g) for h in self.config.held for g in h.gpus)

    def model(self) -> str:
        return self.config.model or next(p.model for p in self.config.pools if p.model) or "model"


def _with_gpu_model(topology: Topology, gpu: str) -> Topology:
    nodes = tuple(replace(n, gpus=tuple(g if g.model else replace(g, model=gpu) for g in n.gpus))
                  for n in topology.nodes)
    return replace(topology, nodes=nodes)


def load_scenario(path: str | Path, policies: Sequence[str] | None = None) -> Scenario:
    """Read and check a scenario; `policies` (from `--policies a,b`) overrides its list."""
    where = str(path)
    raw = load_yaml_file(where, "scenario")
    config = validate_mapping(ScenarioConfig, raw, "scenario", "a scenario is a mapping with `name`, `topology`, "
                              "`pools` and `workload`", where)
    if policies:
        config = config.model_copy(update={"policies": list(policies)})
    source = config.topology
    base = Path(where).resolve().parent
    if source != "nvml" and not Path(source).is_absolute():
        for candidate in (base / source, Path.cwd() / source):
            if candidate.exists():
                source = str(candidate)
                break
    topology = read_source(source)
    if config.gpu is not None:
        from physics import catalog

        try:
            gpu = catalog.gpu_name(config.gpu)
        except ValueError:
            raise ValueError(f"{where}: gpu {config.gpu!r} is not in the catalogue "
                             f"({', '.join(sorted(catalog.gpus()))})") from None
        topology = _with_gpu_model(topology, gpu)
    from pools.placement import get_policy

    for name in config.policies:
        get_policy(name)  # unknown names fail here, with the known ones listed
    from pools.experts.policies import POLICIES as EXPERT_POLICIES

    if config.autoscaling is not None:
        names = {p.name for p in config.pools}
        unknown = sorted(set(config.autoscaling.pools) - names)
        bad = sorted(set(config.autoscaling.autoscalers) - {"static", "blind", "topology"})
        if unknown or bad:
            raise ValueError(f"{where}: autoscaling: " + "; ".join(
                ([f"pools {unknown} are not in the scenario"] if unknown else [])
                + ([f"autoscalers {bad}: static, blind or topology"] if bad else [])))
    for expert in config.expert_policies():
        if expert is not None and expert not in EXPERT_POLICIES:
            raise ValueError(f"{where}: unknown expert_policy {expert!r} (known: {', '.join(EXPERT_POLICIES)})")
    scenario = Scenario(config=config, path=Path(where), topology=topology, topology_source=source)
    scenario.profiles()
    return scenario
