"""The router config's `lora:` block."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AdapterConfig(_Strict):
    name: str = Field(min_length=1, description="the adapter's model id: what a request's `model` names")
    path: str = Field(min_length=1, description="where its engines load it from (vLLM's `lora_path`)")
    base_model: str = Field(min_length=1, description="the served base model it adapts: its replicas serve it")


class LoraConfig(_Strict):
    """LoRA adapters routed like models (docs/router.md: LoRA adapters)."""

    adapters: list[AdapterConfig] = Field(default_factory=list, description="adapters requests may name; each is "
                                          "loaded on a replica of its base model at its first request")
    max_loras: int = Field(default=1, ge=1, description="adapters the router keeps loaded on one replica: its "
                           "engines' --max-cpu-loras (vLLM's default: --max-loras); past it the coldest is unloaded")
    discover: bool = Field(default=True, description="also route adapters the engines already hold (their "
                           "--lora-modules, loads by others), read from their /v1/models")
    refresh_s: float = Field(default=10.0, gt=0, description="how often the engines' /v1/models are read")
    load_timeout_s: float = Field(default=60.0, gt=0, description="the longest an engine's load or unload may take")

    @model_validator(mode="after")
    def _distinct(self) -> LoraConfig:
        names = [a.name for a in self.adapters]
        twice = sorted({n for n in names if names.count(n) > 1})
        problems = [f"adapters listed twice: {twice}"] if twice else []
        problems += [f"adapter {a.name} is named as its base model" for a in self.adapters if a.name == a.base_model]
        if problems:
            raise ValueError("; ".join(problems))
        return self
