"""The one list of routing plugins: kebab-case name -> kind and factory. A factory reads and
checks its own parameters (`Params`); config selects plugins by these names."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

from router.plugins import filters, pickers, scorers
from router.plugins.model import Filter, Picker, Scorer
from router.plugins.params import Params
from router.plugins.spec import PluginSpec

FILTER, SCORER, PICKER = "filter", "scorer", "picker"
Plugin = Filter | Scorer | Picker


class Registration(NamedTuple):
    kind: str
    factory: Callable[[Params], Plugin]


PLUGINS: dict[str, Registration] = {
    "health-filter": Registration(FILTER, filters.health),
    "drain-filter": Registration(FILTER, filters.drain),
    "role-filter": Registration(FILTER, filters.role),
    "slo-class-filter": Registration(FILTER, filters.slo_class),
    "seq-headroom-filter": Registration(FILTER, filters.headroom),
    "context-filter": Registration(FILTER, filters.context),
    "queue-depth-scorer": Registration(SCORER, scorers.queue_depth),
    "kv-usage-scorer": Registration(SCORER, scorers.kv_usage),
    "link-tier-scorer": Registration(SCORER, scorers.link_tier),
    "link-health-scorer": Registration(SCORER, scorers.link_health),
    "prefix-affinity-scorer": Registration(SCORER, scorers.prefix_affinity),
    "kv-cache-scorer": Registration(SCORER, scorers.kv_cache),
    "max-score-picker": Registration(PICKER, pickers.max_score),
    "round-robin-picker": Registration(PICKER, pickers.round_robin),
    "random-picker": Registration(PICKER, pickers.random_pick),
}


def known(kind: str) -> list[str]:
    return [name for name, reg in PLUGINS.items() if reg.kind == kind]


class UnknownPlugin(ValueError):
    """A name the registry does not hold, or holds as another kind."""


def build(spec: PluginSpec, kind: str, where: str) -> Plugin:
    """The plugin `spec` names, built from its parameters; ValueError naming `where` otherwise."""
    reg = PLUGINS.get(spec.name)
    if reg is None:
        raise UnknownPlugin(spec.name)
    if reg.kind != kind:
        raise ValueError(f"{where}: {spec.name} is a {reg.kind}, not a {kind}")
    parameters: Mapping[str, object] = spec.parameters
    return reg.factory(Params(parameters, f"{where}.parameters"))
