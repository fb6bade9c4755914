"""One plugin of a profile as configured (`PluginSpec`). Not compiled: router config validates
it straight from YAML (pydantic reads plain dataclasses), and it is read only when a profile is
built, never per request."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True, kw_only=True)
class PluginSpec:
    """A plugin by its registered name, its weight (scorers) and its own parameters (each plugin
    reads and checks its own)."""

    name: str
    weight: float = 1.0
    parameters: Mapping[str, object] = field(default_factory=dict)
