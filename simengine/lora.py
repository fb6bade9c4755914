"""LoRA adapters on the simulated engine, as vLLM 0.32 serves them.

Two parts, as in vLLM:

- `Adapters`, the API server's registry (vllm/entrypoints/openai/models/serving.py
  `OpenAIServingModels`): the adapters a request may name, from `--lora-modules` at start and
  `POST /v1/load_lora_adapter` / `/v1/unload_lora_adapter` at run time (those two routes exist only
  with `VLLM_ALLOW_RUNTIME_LORA_UPDATING=1|true`, vllm/entrypoints/serve/lora/api_router.py); each
  gets the next integer id; `/v1/models` lists each after the base model, `root` its path and
  `parent` its base model. The registry has no size limit (nor has vLLM's): what the engine keeps
  loaded is the core's business. The simulated engine reads no weights: any path is taken.
- `LoraSlots`, the engine's (pure, in `simengine.core`): `max_cpu_loras` adapters kept in host
  memory and `max_loras` GPU slots, each least recently used first out (vLLM's
  LRUCacheWorkerLoRAManager and LoRAModelManager). A load puts the adapter in the host cache
  (`physics.lora.LoraCost.load_ms`); a step whose batch uses an adapter pays its load if the host
  cache dropped it, its copy into a GPU slot if it has none (`activate_ms`), and the batch's LoRA
  kernels (`step_overhead_ms`). At most `max_loras` distinct adapters are in one batch (the
  scheduler skips a waiting request whose adapter would exceed it, vllm/v1/core/sched/scheduler.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
from collections import OrderedDict
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from kvblocks.events import BlockStored, Event
from physics.lora import DEFAULT_MAX_LORA_RANK, DEFAULT_MAX_LORAS, LoraCost
from wire.errors import ApiError

log = logging.getLogger("isleserve.engine")

RUNTIME_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""vLLM's allowed `--max-lora-rank` values (vllm/config/lora.py `MaxLoRARanks`)."""


def runtime_updating(environ: dict[str, str] | None = None) -> bool:
    """The load/unload routes are served (vLLM's envs.py reads the variable this way)."""
    value = (environ if environ is not None else os.environ).get(RUNTIME_ENV, "0")
    return value.strip().lower() in ("1", "true")


@dataclass(frozen=True, slots=True, kw_only=True)
class LoraSpec:
    """`--enable-lora` and its sizes (vLLM's LoRAConfig)."""

    max_loras: int = DEFAULT_MAX_LORAS
    """Distinct adapters in one batch (GPU slots)."""
    max_cpu_loras: int | None = None
    """Adapters kept in host memory; None: `max_loras` (vLLM's default)."""
    max_lora_rank: int = DEFAULT_MAX_LORA_RANK

    def __post_init__(self) -> None:
        if self.max_loras < 1:
            raise ValueError(f"--max-loras must be >= 1, got {self.max_loras}")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras}).")
        if self.max_lora_rank not in MAX_LORA_RANKS:
            raise ValueError(f"--max-lora-rank {self.max_lora_rank} is not one of {list(MAX_LORA_RANKS)}")

    @property
    def cpu_capacity(self) -> int:
        return self.max_cpu_loras if self.max_cpu_loras is not None else self.max_loras


@dataclass(slots=True)
class LoraSlots:
    """The engine's host cache and GPU slots (module docstring); every cost in ms."""

    spec: LoraSpec
    cost: LoraCost
    cpu: OrderedDict[str, None] = field(default_factory=OrderedDict)
    gpu: OrderedDict[str, None] = field(default_factory=OrderedDict)
    loads: int = 0
    activations: int = 0

    def load(self, name: str) -> float:
        """`add_lora`: into the host cache (the oldest out past `max_cpu_loras`); its cost."""
        self.cpu.pop(name, None)
        while len(self.cpu) >= self.spec.cpu_capacity:
            self.cpu.popitem(last=False)
        self.cpu[name] = None
        self.loads += 1
        return self.cost.load_ms()

    def fits(self, batch: Collection[str], name: str | None) -> bool:
        """A request of adapter `name` may join a batch already using `batch`."""
        return not name or name in batch or len(batch) < self.spec.max_loras

    def step_ms(self, batch: Iterable[str]) -> float:
        """What a step using the adapters `batch` adds: loads, activations and kernels."""
        used = list(dict.fromkeys(batch))
        ms = 0.0
        for name in used:
            if name in self.cpu:
                self.cpu.move_to_end(name)
            else:
                ms += self.load(name)
            if name in self.gpu:
                self.gpu.move_to_end(name)
                continue
            while len(self.gpu) >= self.spec.max_loras:
                self.gpu.popitem(last=False)  # the scheduler keeps a batch within max_loras: never one in use
            self.gpu[name] = None
            self.activations += 1
            ms += self.cost.activate_ms()
        return ms + self.cost.step_overhead_ms(len(used))


@dataclass(frozen=True, slots=True)
class LoraModule:
    """A `--lora-modules` entry (vLLM's LoRAModulePath)."""

    name: str
    path: str
    base_model_name: str | None = None


def parse_module(text: str) -> LoraModule:
    """`name=path`, or JSON `{"name", "path", "base_model_name"}` (vLLM's LoRAParserAction)."""
    if "=" in text and "," not in text:
        name, path = text.split("=", 1)
        return LoraModule(name, path)
    try:
        data = json.loads(text)
        return LoraModule(str(data["name"]), str(data["path"]), data.get("base_model_name"))
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"Invalid --lora-modules entry {text!r}: want name=path or JSON "
                         f"{{\"name\", \"path\", \"base_model_name\"}} ({err})") from None


@dataclass(slots=True)
class Registered:
    name: str
    path: str
    lora_id: int
    base: str


class Adapters:
    """The API server's adapter registry (module docstring). `base`: the served model name;
    `slots`: the engine's (None: registration only); `time_scale`: wall seconds per modelled one."""

    def __init__(self, base: str, slots: LoraSlots | None = None, time_scale: float = 1.0) -> None:
        self.base, self.slots, self.time_scale = base, slots, time_scale
        self.loaded: dict[str, Registered] = {}
        self._next_id = 0
        self._locks: dict[str, asyncio.Lock] = {}

    def static(self, modules: Iterable[LoraModule]) -> None:
        """`--lora-modules` at start (vLLM's init_static_loras: a refused one stops the start)."""
        for module in modules:
            try:
                self.check_load({"lora_name": module.name, "lora_path": module.path})
            except ApiError as err:
                raise ValueError(f"--lora-modules {module.name}: {err.message}") from None
            self.register(module.name, module.path)

    async def load_route(self, body: dict[str, Any]) -> bytes:
        """POST /v1/load_lora_adapter: the checks and the engine's load under the name's lock (a
        second load of one name waits, then is refused as loaded already); the load's time passes
        first (`physics.lora`). vLLM's plain-text answer."""
        name = body.get("lora_name")
        async with self._locks.setdefault(str(name), asyncio.Lock()):
            self.check_load(body)
            if self.slots is not None:
                await asyncio.sleep(self.slots.cost.load_ms() / 1000.0 * self.time_scale)
            self.register(str(name), str(body["lora_path"]))
        log.info("Loaded new LoRA adapter: name '%s', path '%s'", name, body["lora_path"])
        return f"Success: LoRA adapter '{name}' added successfully.".encode()

    def unload_route(self, body: dict[str, Any]) -> bytes:
        name = self.unload(body)
        log.info("Removed LoRA adapter: name '%s'", name)
        return f"Success: LoRA adapter '{name}' removed successfully.".encode()

    def check_load(self, body: dict[str, Any]) -> None:
        """`/v1/load_lora_adapter`'s checks, in vLLM's words (ApiError on refusal)."""
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path or not isinstance(name, str) or not isinstance(path, str):
            raise ApiError(400, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput")
        if name == self.base:
            raise ApiError(400, f"The lora adapter '{name}' conflicts with a served base model.", "InvalidUserInput")
        if not body.get("load_inplace") and name in self.loaded:
            raise ApiError(400, f"The lora adapter '{name}' has already been loaded. If you want to load the "
                           "adapter in place, set 'load_inplace' to True.", "InvalidUserInput")

    def register(self, name: str, path: str) -> Registered:
        """After the engine loaded it: its id kept when reloaded in place, else the next one."""
        previous = self.loaded.get(name)
        if previous is None:
            self._next_id += 1
        lora_id = previous.lora_id if previous is not None else self._next_id
        found = self.loaded[name] = Registered(name, path, lora_id, self.base)
        if self.slots is not None:
            self.slots.load(name)  # into the engine's host cache
        return found

    def unload(self, body: dict[str, Any]) -> str:
        name = body.get("lora_name")
        if not name or not isinstance(name, str):
            raise ApiError(400, "'lora_name' needs to be provided to unload a LoRA adapter.", "InvalidUserInput")
        if name not in self.loaded:
            raise ApiError(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        del self.loaded[name]
        return name

    def with_id(self, event: Event) -> Event:
        """A `BlockStored` of an adapter's blocks with the adapter's id (vLLM's `lora_id`)."""
        if isinstance(event, BlockStored) and event.lora_name and event.lora_name in self.loaded:
            return dataclasses.replace(event, lora_id=self.loaded[event.lora_name].lora_id)
        return event

    def cards(self, created: int) -> list[dict[str, Any]]:
        """The adapters' ModelCards after the base model's (vLLM's show_available_models)."""
        return [{"id": r.name, "object": "model", "created": created, "owned_by": "vllm", "root": r.path,
                 "parent": r.base, "max_model_len": None, "permission": [permission(r.name, created)]}
                for r in self.loaded.values()]


def permission(model: str, created: int) -> dict[str, Any]:
    """vLLM's ModelPermission with its defaults."""
    return {"id": f"modelperm-{model}", "object": "model_permission", "created": created,
            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False, "organization": "*",
            "group": None, "is_blocking": False}
