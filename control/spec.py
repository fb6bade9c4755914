"""What the controller needs to know, as plain data (the router layer builds it from its args)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from control.benches.schedule import BenchPolicy
from control.state.files import default_state_dir
from pools.autoscale.policy import AutoscalingConfig
from pools.kvrepair import KvPathAction
from pools.model import DEFAULT_SLO_CLASSES, PoolSpec, SLOClass
from pools.pinning import Pin
from pools.ports import EnginePorts, PortPlan
from pools.transportenv import TRANSPORT_ENV
from pools.vllmconfig import VllmSettings

ENGINE_ENV = tuple(dict.fromkeys(("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NCCL_IB_HCA", "UCX_NET_DEVICES",
                                   "NCCL_SOCKET_IFNAME", *TRANSPORT_ENV)))
"""The variables pinning sets and those that choose the engine's transports
(`pools.transportenv`), which a replica reports back from its engine's environment."""

SIM_READY_TIMEOUT_S = 120.0
"""How long a simulated engine may take to print its ready line: a second or two alone, its
imports alone can take a minute on two cores that three other test lanes load."""


@dataclass(frozen=True, slots=True, kw_only=True)
class VllmLaunch:
    """What a vLLM replica adds to its launch: its pool's settings, the ports the controller gave
    it on its node, and each planned GPU's CPU list (for the CPU backend's thread binding)."""

    settings: VllmSettings
    ports: EnginePorts
    gpu_cpus: tuple[str, ...] = ()


def kv_events_args(endpoint: str, topic: str, block_size: int) -> tuple[str, ...]:
    """vLLM's flags for an engine that publishes its prefix cache's events to `endpoint` under
    `topic` (ZMQ; no replay endpoint): the simulated engine takes the same ones."""
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint, "topic": topic}
    return ("--enable-prefix-caching", "--block-size", str(block_size), "--kv-events-config",
            json.dumps(config, separators=(",", ":")))


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineLaunch:
    """One replica's engine: everything `python -m pools sim-engine` (or, with `vllm`, the vLLM
    launcher) needs, and where it runs."""

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
    vllm: VllmLaunch | None = None
    """A real vLLM server instead of the simulated engine."""
    admin_routes: bool = False
    """The simulated engine serves its fault-injection routes (tests and chaos runs only)."""
    admin_token: str = field(default="", repr=False)
    """The token those routes need (the engine gets it in its environment, never in argv)."""
    api_key: str = field(default="", repr=False)
    """The key the engine's API wants (`VLLM_API_KEY` in its environment, vLLM's `--api-key`):
    only the router, which the controller gives it, can send it work."""
    gang: str = ""
    """One data-parallel rank of a gang: its `sim-engine --gang` JSON (control.launch.gang)."""
    engine_args: tuple[str, ...] = ()
    """The pool's serving flags (vLLM's tool-calling and reasoning flags, `pools.vllmconfig.
    serving_args`), after the simulated engine's own."""
    kv_events: tuple[str, ...] = ()
    """Prefix caching on and its events published to the router (`kv_events_args`): the same
    flags for both engines."""
    ranks: tuple[EngineLaunch, ...] = ()
    """A gang: one launch per data-parallel rank (each its own engine and actor), started,
    restarted and stopped as a unit; `node` and `gpus` are then its first member's."""

    @property
    def actor_name(self) -> str:
        return f"isleserve-{self.replica_id}-g{self.generation}"

    @property
    def ready_timeout_s(self) -> float:
        """How long the engine may take to answer /health after its start."""
        return self.vllm.settings.start_timeout_s if self.vllm is not None else SIM_READY_TIMEOUT_S

    def command(self) -> list[str]:
        placement = json.dumps({"node": self.node, "gpus": list(self.gpus)})
        return ["-m", "pools", "sim-engine", "--model", self.model, "--gpu", self.gpu, "--tp", str(self.tp),
                "--role", self.role, "--port", "0", "--time-scale", str(self.time_scale), "--topology",
                self.topology_source, "--placement", placement, "--engine-id", self.replica_id,
                *(("--gang", self.gang) if self.gang else ()), *(("--admin-routes",) if self.admin_routes else ()),
                *self.engine_args, *self.kv_events]

    def environment(self) -> dict[str, str]:
        """What a GPU engine gets from the plan (the simulated one ignores it, but carries it)."""
        return {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in self.gpus), "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                **self.pin.env}


@dataclass(frozen=True, slots=True, kw_only=True)
class AutoscaleSpec:
    """The live autoscaler (control.autoscaling): each autoscaled pool's policy settings
    and the loop's own."""

    pools: Mapping[str, AutoscalingConfig] = field(default_factory=dict)
    interval_s: float = 5.0
    """A decision this often (on the health loop)."""
    look_back_s: float = 10.0
    """Load and arrival rate averaged over this long (Ray Serve's `look_back_period_s`)."""
    window_s: float = 60.0
    """Tail latencies over this long."""
    drain_timeout_s: float = 600.0
    """A scaled-in replica stops once idle, or after this long at the latest (streams finish)."""
    prompt_tokens: int = 1155
    output_tokens: int = 211
    """The requests' mean lengths, for the sizing model's capacity (`workload` of the app)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ControllerSpec:
    topology_source: str
    engine: str
    policy: str
    pools: tuple[PoolSpec, ...]
    slo_classes: Mapping[str, SLOClass] = field(default_factory=lambda: {c.name: c for c in DEFAULT_SLO_CLASSES})
    time_scale: float = 1.0
    state_dir: str = field(default_factory=default_state_dir)
    """A private directory (control.state.files): $XDG_STATE_HOME/isleserve, else
    ~/.local/state/isleserve, unless told."""
    counters_interval_s: float = 30.0
    """How often link counters are read again (a discovery on every node); 0: never."""
    drain_timeout_s: float = 30.0
    """A replaced replica stops when idle, or after this long at the latest."""
    vllm: Mapping[str, VllmSettings] = field(default_factory=dict)
    """engine vllm: each pool's server settings."""
    ports: PortPlan = field(default_factory=PortPlan)
    """engine vllm: the ranges each node's engine ports come from."""
    bench: BenchPolicy = field(default_factory=BenchPolicy)
    autoscale: AutoscaleSpec = field(default_factory=AutoscaleSpec)
    """Pools that follow the load (none: every pool keeps its count)."""
    engine_admin_routes: bool = False
    """Simulated engines serve their fault-injection routes (tests and chaos runs only)."""
    engine_args: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """engine sim: each pool's serving flags (`EngineLaunch.engine_args`)."""
    kv_events_endpoint: str = ""
    """Where the router's KV-event subscriber is bound (router config `kv_events.endpoint`):
    every engine but a gang's is started with prefix caching on, publishing there under its
    replica id; empty: none publishes."""
    kv_block_size: int = 16
    """The engines' KV block size (`--block-size`, the router's `kv_events.block_size`)."""
    kv_path_action: KvPathAction = field(default_factory=KvPathAction)
    """What the controller does about a PD pair the router judges wrong_path/failing (`pools.kvrepair`)."""
