"""The product's settings under a Ray Serve config's `args` (configs/local.yaml, configs/prod.yaml),
validated by pydantic with every problem reported at once, and the plan they would deploy.

    applications:
      - name: isleserve
        import_path: isleserve.app:build
        args:
          topology: configs/clusters/local-sim.yaml     # or nvml: discovery on every Ray node
          engine: sim                                   # or vllm
          policy: island-aligned
          pools: [{name: ..., role: ..., tp: ..., replicas: ..., model: ..., vllm: {model: ...}}]
          vllm: {venv: ..., ports: {http: [8100, 8199], side_channel: [5600, 5699]}}   # engine vllm
          vllm: {tool_call_parser: hermes, enable_auto_tool_choice: true}   # either engine: tool calls
          bench_on_change: false                        # topology bench at deploy and after changes
          bench_interval_s: 0                           # and on a schedule (0: never)
          autoscaling: {interval_s: 5, look_back_s: 10, window_s: 60}   # pools with `autoscaling:`
          kv_path_action: {action: none, after_s: 120}  # or replace: re-place a decode on the wrong path
          router: {port: 8000, keys: [...], admin_keys: [...], ...}
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from control.state.files import default_state_dir
from pools.config import PoolConfig, PoolsConfig, SLOClassConfig
from pools.kvrepair import KvPathAction
from pools.placement import POLICIES
from pools.vllmconfig import VllmAppConfig, VllmSettings, serving_args, settings_for, sim_args
from router.config import RouterConfig
from topology.configfile import load_yaml_file, validate_mapping
from topology.errors import ParseError


class AutoscaleLoopConfig(BaseModel):
    """The live autoscaler's loop; each pool's own settings are its `autoscaling:` block."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    interval_s: float = Field(default=5.0, gt=0, description="a decision this often (the health loop runs every "
                                                             "2 s: shorter acts as 2 s)")
    look_back_s: float = Field(default=10.0, gt=0, description="load and arrival rate averaged over this long")
    window_s: float = Field(default=60.0, gt=0, description="tail latencies over this long")
    drain_timeout_s: float = Field(default=600.0, gt=0, description="a scaled-in replica stops once idle, or after "
                                                                    "this long at the latest")


class KvPathActionConfig(BaseModel):
    """What the controller does about a prefill/decode pair the router judges `wrong_path` or
    `failing` (issue 34). Every verdict change is a `kv_path` event either way, and per request
    the router already avoids a bad pair (re-pairing)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    action: Literal["none", "replace"] = Field(default="none", description="`replace`: re-place the pair's decode "
                                                                           "replica (make-before-break, off its GPUs "
                                                                           "and NICs); `none`: events only")
    after_s: float = Field(default=120.0, gt=0, description="once the pair has been wrong_path/failing this long")
    cooldown_s: float = Field(default=600.0, ge=0, description="a replica re-placed for its path is not re-placed "
                                                               "for it again this soon")

    def policy(self) -> KvPathAction:
        return KvPathAction(action=self.action, after_s=self.after_s, cooldown_s=self.cooldown_s)


class AppArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    topology: str = Field(description="`nvml` (discovery on every Ray node) or a topology source")
    engine: Literal["sim", "vllm"] = Field(description="simulated engines, or real vLLM servers")
    policy: str = Field(default="island-aligned", description="placement policy name")
    pools: list[PoolConfig] = Field(min_length=1)
    slo_classes: list[SLOClassConfig] = Field(default_factory=list)
    router: RouterConfig = Field(description="the router's settings (its replicas come from the plan)")
    time_scale: float = Field(default=1.0, gt=0, description="simulated engines: wall seconds per modelled second")
    workload: str = Field(default="azure-conv", description="for `replicas: auto`")
    state_dir: str = Field(default_factory=default_state_dir,
                           description="where the controller records topology, plans and the state it resumes from: "
                                       "a private 0700 directory of this user (default $XDG_STATE_HOME/isleserve, "
                                       "else ~/.local/state/isleserve); refused when another user owns it or others "
                                       "may write to it")
    counters_interval_s: float = Field(default=30.0, ge=0,
                                       description="how often link counters are read on every node (0: never)")
    drain_timeout_s: float = Field(default=30.0, gt=0,
                                   description="a replaced replica stops when idle, or after this long at the latest")
    vllm: VllmAppConfig = Field(default_factory=VllmAppConfig,
                                description="vLLM settings every pool gets (pools[].vllm overrides them) and the "
                                            "per-node port ranges; simulated engines take the serving flags "
                                            "(tool_call_parser, enable_auto_tool_choice, reasoning_parser, "
                                            "enable_lora, max_loras, max_cpu_loras, max_lora_rank, lora_modules, "
                                            "allow_runtime_lora_updating)")
    bench_on_change: bool = Field(default=False, description="run the topology bench on every node at deploy and "
                                                             "after topology changes (nodes joined, replaced, "
                                                             "back; links marked)")
    bench_interval_s: float = Field(default=0.0, ge=0, description="and again every this many seconds (0: never)")
    bench_size_mib: float | None = Field(default=None, gt=0, description="bench message size (default: 256 MiB "
                                                                         "on NCCL, 8 MiB on gloo)")
    bench_iters: int | None = Field(default=None, ge=1, description="bench timed iterations (default 20 / 5)")
    engine_admin_routes: bool = Field(default=False, description="simulated engines serve /admin/faults and "
                                                                 "/admin/steps (fault injection: tests and chaos "
                                                                 "runs only)")
    insecure: bool = Field(default=False, description="allow Ray without token authentication on a "
                                                      "non-loopback address (anyone who reaches a Ray port can run "
                                                      "code); refused unless set")
    autoscaling: AutoscaleLoopConfig = Field(
        default_factory=AutoscaleLoopConfig,
        description="the autoscaler's loop, for pools with `autoscaling:` (control.autoscaling)")
    kv_path_action: KvPathActionConfig = Field(
        default_factory=KvPathActionConfig,
        description="what the controller does about a PD pair whose KV transfers take the wrong path (control.kvpaths)")

    @model_validator(mode="before")
    @classmethod
    def _classes_once(cls, raw: Any) -> Any:
        """SLO classes are declared once: `args.slo_classes` (the placement's) or
        `args.router.slo_classes` (admission's and routing's); the other is derived from it. Both
        declared and different is an error that names both paths."""
        if not isinstance(raw, dict) or not isinstance(raw.get("router"), dict):
            return raw
        app, routed = raw.get("slo_classes"), raw["router"].get("slo_classes")
        if app and routed and _canonical(app) != _canonical(routed):
            raise ValueError("args.slo_classes and args.router.slo_classes disagree; declare the SLO classes once "
                             "(args.slo_classes: the router derives its own from them)")
        if app and not routed:
            return {**raw, "router": {**raw["router"], "slo_classes": app}}
        if routed and not app:
            return {**raw, "slo_classes": routed}
        return raw

    @model_validator(mode="after")
    def _consistent(self) -> AppArgs:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r} (policies: {', '.join(POLICIES)})")
        if self.engine == "sim" and self.topology == "nvml":
            raise ValueError("simulated engines need a declared topology (a cluster spec), not nvml")
        if self.engine == "vllm" and not self.router.require_keys:
            raise ValueError("a vLLM (production) deployment must set router.require_keys")
        PoolsConfig(pools=self.pools, slo_classes=self.slo_classes)  # pool-level cross-checks
        problems = []
        for i, pool in enumerate(self.pools):
            try:
                if self.engine == "vllm":
                    settings_for(self.vllm, pool.vllm, pool.model)
                else:
                    serving_args(self.vllm, pool.vllm)
            except ValueError as err:
                problems.append(f"pools[{i}] ({pool.name}): {err}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def vllm_settings(self, resolve: Callable[[str], str] = lambda p: p) -> dict[str, VllmSettings]:
        """Each pool's resolved vLLM settings (engine vllm), `resolve` making paths absolute."""
        if self.engine != "vllm":
            return {}
        return {p.name: settings_for(self.vllm, p.vllm, p.model, resolve) for p in self.pools}

    def engine_args(self) -> dict[str, tuple[str, ...]]:
        """Simulated engines: each pool's serving flags (vLLM's tool-calling, reasoning and LoRA flags,
        `pools.vllmconfig.sim_args`); a vLLM server has them in its settings' arguments."""
        if self.engine != "sim":
            return {}
        return {p.name: sim_args(self.vllm, p.vllm) for p in self.pools}

    def pools_config(self) -> PoolsConfig:
        return PoolsConfig(pools=self.pools, slo_classes=self.slo_classes)


def _canonical(classes: Any) -> Any:
    """SLO class declarations as validated (defaults filled in), to compare two of them."""
    try:
        return sorted(SLOClassConfig.model_validate(c).model_dump_json() for c in classes)
    except Exception:  # a malformed list: the field's own validation says what is wrong
        return classes


def parse_app_args(raw: object, where: str = "args") -> AppArgs:
    return validate_mapping(AppArgs, raw, "isleserve args", "the application's `args` must be a mapping", where)


def app_args_from_serve_config(path: str) -> AppArgs:
    """The isleserve application's args in a Ray Serve config file."""
    doc = load_yaml_file(path, "Ray Serve config")
    apps = doc.get("applications") if isinstance(doc, dict) else None
    if not isinstance(apps, list):
        raise ParseError("a Ray Serve config has an `applications` list", path)
    for app in apps:
        if isinstance(app, dict) and app.get("import_path") == "isleserve.app:build":
            return parse_app_args(app.get("args"), path)
    raise ParseError("no application with import_path isleserve.app:build", path)
