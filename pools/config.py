"""POOLS.yaml: the pools to place and, optionally, the SLO classes (pydantic, at the edge).

    pools:
      - {name: prefill, role: prefill, tp: 4, replicas: 2, model: llama-3.1-70b, slo_classes: [interactive]}
      - {name: decode, role: decode, tp: 2, replicas: auto, model: llama-3.1-70b}
        vllm: {model: meta-llama/Llama-3.1-70B-Instruct}   # optional: the real server (pools.vllmconfig)
        autoscaling: {min_replicas: 1, max_replicas: 6}    # optional: follow the load (pools.autoscale)
    slo_classes:                      # optional; defaults: interactive, standard, batch
      - {name: interactive, priority: 0, ttft_ms: 500, tpot_ms: 50}
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from physics import catalog
from pools.autoscale.policy import AutoscalingConfig
from pools.model import DEFAULT_SLO_CLASSES, ExpertChoice, PoolSpec, SLOClass
from pools.sizing import SizingProposal, size
from pools.vllmconfig import VllmPoolConfig
from topology import Topology
from topology.configfile import load_yaml_file, validate_mapping
from topology.errors import ParseError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SLOClassConfig(_Strict):
    name: str = Field(min_length=1)
    priority: int = Field(ge=0, description="lower is served first (vLLM's priority)")
    ttft_ms: float = Field(gt=0, description="time-to-first-token target")
    tpot_ms: float = Field(gt=0, description="time-per-output-token target")
    sheddable: bool = False
    max_concurrency: int | None = Field(default=None, gt=0)
    max_queue_ms: float | None = Field(default=None, gt=0)

    def to_slo(self) -> SLOClass:
        return SLOClass(**self.model_dump())


class AutoscalingPoolConfig(_Strict):
    """A pool that follows the load: Ray Serve's `autoscaling_config` fields, plus the SLO and
    prediction settings of `pools.autoscale.policy` (whose docstring says how they combine)."""

    min_replicas: int = Field(default=1, ge=1, description="never fewer replicas (no scale to zero)")
    max_replicas: int = Field(default=8, ge=1, description="never more replicas")
    initial_replicas: int | None = Field(default=None, ge=1, description="at deploy (default: the pool's `replicas`, "
                                                                        "else min_replicas)")
    target_ongoing_requests: float = Field(default=32.0, gt=0, description="requests in flight per replica aimed at")
    upscale_delay_s: float = Field(default=10.0, ge=0, description="how long a scale-out must be wanted")
    downscale_delay_s: float = Field(default=60.0, ge=0, description="how long a scale-in must be wanted")
    cooldown_s: float = Field(default=10.0, ge=0, description="no change this soon after the last one")
    upscaling_factor: float = Field(default=1.0, gt=0, description="share of the way to the target per scale-out")
    downscaling_factor: float = Field(default=1.0, gt=0, description="share of the way to the target per scale-in")
    slo_percentile: float = Field(default=95.0, ge=50, lt=100, description="the tail latency judged against the "
                                                                           "SLO targets")
    slo_headroom: float = Field(default=0.9, gt=0, description="over this share of a target: the pool is short")
    slo_slack: float = Field(default=0.75, gt=0, description="over this share of a target: the pool may not shrink")
    sizing_slo_share: float | None = Field(default=0.8, gt=0, description="one replica's capacity from the sizing "
                                           "model at this share of the targets (null: no prediction)")

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingPoolConfig:
        self.policy()  # the policy's own checks, every problem at once
        if self.initial_replicas is not None and not self.min_replicas <= self.initial_replicas <= self.max_replicas:
            raise ValueError(f"initial_replicas {self.initial_replicas} is outside [min_replicas {self.min_replicas}, "
                             f"max_replicas {self.max_replicas}]")
        return self

    def policy(self) -> AutoscalingConfig:
        return AutoscalingConfig(**self.model_dump(exclude={"initial_replicas"}))

    def initial(self, replicas: int | None) -> int:
        """The count a deployment starts from: `initial_replicas`, else the pool's own count
        within [min_replicas, max_replicas], else min_replicas."""
        if self.initial_replicas is not None:
            return self.initial_replicas
        if replicas is None:
            return self.min_replicas
        return min(max(replicas, self.min_replicas), self.max_replicas)


class ExpertsConfig(_Strict):
    policy: Literal["topology", "eplb", "linear"] = Field(default="topology", description="expert placement policy")
    load: str = Field(default="zipf:1.3", description="expert load: a load file or zipf:SKEW[:SEED]")
    redundant: int = Field(default=0, ge=0, description="redundant experts ((E + R) % EP == 0)")
    locality: bool = Field(default=True, description="a token uses a copy of an expert in its own NVLink domain "
                           "(the isleserve vLLM plugin); false: any copy (vLLM's own choice)")


class PoolConfig(_Strict):
    name: str = Field(min_length=1, pattern=r"^[a-z0-9][a-z0-9-]*$")
    role: Literal["prefill", "decode", "mixed"]
    tp: int = Field(ge=1, le=72, description="tensor-parallel size")
    replicas: int | Literal["auto"] = Field(description="replica count, or auto (pool sizing)")
    model: str | None = Field(default=None, description="catalogue model; without it no memory check")
    slo_classes: list[str] = Field(default_factory=list)
    require_island: bool = False
    pp: int = Field(default=1, ge=1, le=64, description="pipeline stages")
    dp: int = Field(default=1, ge=1, le=1024, description="data-parallel attention ranks (each tp GPUs)")
    expert_parallel: bool = Field(default=False, description="MoE experts split over tp x dp GPUs (EP)")
    require_domain: bool = Field(default=False, description="a gang no NVLink domain can hold stays unplaced")
    experts: ExpertsConfig | None = Field(default=None, description="EP gangs: compute the expert map with the plan")
    vllm: VllmPoolConfig | None = Field(default=None, description="this pool's vLLM server (engine vllm)")
    autoscaling: AutoscalingPoolConfig | None = Field(
        default=None, description="follow the load (`replicas` is then the count it starts from)")

    def spec(self, replicas: int) -> PoolSpec:
        return PoolSpec(name=self.name, role=self.role, tp=self.tp, replicas=replicas, model=self.model,
                        slo_classes=tuple(self.slo_classes), require_island=self.require_island, pp=self.pp,
                        dp=self.dp, expert_parallel=self.expert_parallel, require_domain=self.require_domain,
                        experts=None if self.experts is None else ExpertChoice(
                            policy=self.experts.policy, load=self.experts.load, redundant=self.experts.redundant,
                            locality=self.experts.locality))

    @model_validator(mode="after")
    def _gang(self) -> PoolConfig:
        spec = catalog.models().get(self.model) if self.model else None
        if self.expert_parallel:
            if self.model is None:
                raise ValueError("expert_parallel needs a catalogue MoE model (`model:`)")
            if spec is not None and spec.moe is None:
                raise ValueError(f"expert_parallel: {self.model} is a dense model (no experts to split)")
        if spec is not None and self.pp > spec.layers:
            raise ValueError(f"pp: {self.pp} stages for {self.model}, which has {spec.layers} layers")
        if self.experts is not None:
            if not self.expert_parallel:
                raise ValueError("experts: an expert map needs expert_parallel: true")
            routed = spec.moe.routed_experts if spec is not None and spec.moe is not None else 0
            ep = self.tp * self.dp
            if (routed + self.experts.redundant) % ep:
                raise ValueError(f"experts.redundant: {routed} experts + {self.experts.redundant} redundant do not "
                                 f"split evenly over EP{ep} (need (E + R) % EP == 0)")
        return self

    @field_validator("model")
    @classmethod
    def _known_model(cls, v: str | None) -> str | None:
        if v is not None and v not in catalog.models():
            raise ValueError(f"unknown model {v!r} (known: {', '.join(sorted(catalog.models()))})")
        return v

    @field_validator("replicas")
    @classmethod
    def _count(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 0:
            raise ValueError("replicas must be >= 0 or auto")
        return v


class PoolsConfig(_Strict):
    pools: list[PoolConfig] = Field(min_length=1)
    slo_classes: list[SLOClassConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> PoolsConfig:
        names = [p.name for p in self.pools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate pool names: {', '.join(dupes)}")
        known = {c.name for c in self.slo_classes} or {c.name for c in DEFAULT_SLO_CLASSES}
        for p in self.pools:
            unknown = sorted(set(p.slo_classes) - known)
            if unknown:
                raise ValueError(f"pool {p.name}: unknown SLO classes {unknown} (known: {sorted(known)})")
        return self

    def classes(self) -> dict[str, SLOClass]:
        chosen = [c.to_slo() for c in self.slo_classes] or list(DEFAULT_SLO_CLASSES)
        return {c.name: c for c in chosen}

    def auto_pairs(self) -> list[tuple[PoolConfig, PoolConfig]]:
        """(prefill, decode) pools of one model where either says `replicas: auto`."""
        autos = [p for p in self.pools if p.replicas == "auto"]
        pairs = []
        for pool in autos:
            if pool.role == "mixed":
                raise ParseError(f"pool {pool.name}: replicas auto sizes prefill/decode pools; "
                                 "give mixed pools a count")
            want = "decode" if pool.role == "prefill" else "prefill"
            partner = next((p for p in self.pools if p.role == want and p.model == pool.model), None)
            if partner is None or pool.model is None:
                raise ParseError(f"pool {pool.name}: replicas auto needs a model and a {want} pool of the same model")
            pair = (pool, partner) if pool.role == "prefill" else (partner, pool)
            if pair not in pairs:
                pairs.append(pair)
        return pairs

    def pool_specs(self, auto_counts: dict[str, int] | None = None) -> tuple[PoolSpec, ...]:
        specs = []
        for p in self.pools:
            if p.replicas == "auto":
                if not auto_counts or p.name not in auto_counts:
                    raise ParseError(f"pool {p.name}: replicas is auto; size it with `python -m pools size`")
                count = auto_counts[p.name]
            else:
                count = p.replicas
            if p.autoscaling is not None:
                count = p.autoscaling.initial(count)
            specs.append(p.spec(count))
        return tuple(specs)

    def autoscaling(self) -> dict[str, AutoscalingConfig]:
        """The pools that follow the load, with their policy settings."""
        return {p.name: p.autoscaling.policy() for p in self.pools if p.autoscaling is not None}

    def check_domains(self, largest_domain: int) -> None:
        """A pool that requires one NVLink domain asks for no more GPUs than the largest has."""
        for k, p in enumerate(self.pools):
            size = p.tp * p.pp * p.dp
            if p.require_domain and size > largest_domain:
                raise ParseError(f"invalid pools file: pools[{k}].require_domain: pool {p.name} needs dp x tp x pp = "
                                 f"{p.dp} x {p.tp} x {p.pp} = {size} GPUs in one NVLink domain; the largest here "
                                 f"has {largest_domain}")


def load_pools(path: str) -> PoolsConfig:
    raw = load_yaml_file(path, "pools file")
    return validate_mapping(PoolsConfig, raw, "pools file", "a pools file is a mapping with a top-level `pools:` list",
                            path)


def size_auto_pairs(config: PoolsConfig, topology: Topology, workload: str, gpu_name: str | None = None
                    ) -> list[tuple[str, str, SizingProposal]]:
    """Every `replicas: auto` prefill/decode pair of a pools file, sized: (prefill pool, decode pool,
    the proposal), with the pair's own TP sizes and gang ranks and its SLO classes (all of the
    file's when it names none)."""
    out = []
    classes = config.classes()
    for prefill, decode in config.auto_pairs():
        slos = [classes[c] for c in {*prefill.slo_classes, *decode.slo_classes}] or list(classes.values())
        proposal = size(topology, str(prefill.model), workload, slos, gpu_name, prefill.tp, decode.tp,
                        prefill.dp if prefill.dp > 1 else None, decode.dp if decode.dp > 1 else None)
        out.append((prefill.name, decode.name, proposal))
    return out


def auto_counts(sized: list[tuple[str, str, SizingProposal]]) -> dict[str, int]:
    """Replica counts per pool from `size_auto_pairs`."""
    counts: dict[str, int] = {}
    for prefill, decode, proposal in sized:
        counts[prefill], counts[decode] = proposal.prefill_replicas, proposal.decode_replicas
    return counts
