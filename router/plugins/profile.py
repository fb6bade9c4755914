"""A routing profile: filters, weighted scorers and a picker, named in config and built from the
registry when the profile is made (so a bad name or parameter fails at load, never per request).

Every config form builds the same profile:
    filters: [health-filter, {name: role-filter, parameters: {role: decode}}]
    scorers: {queue-depth-scorer: 1.0}                        # name -> weight
    scorers: {queue-depth-scorer: {weight: 1.0, parameters: {running_weight: 0.5}}}
    scorers: [{name: queue-depth-scorer, weight: 1.0, parameters: {...}}]   # llm-d's list
    picker: max-score-picker | {name: max-score-picker}
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from router.plugins import registry
from router.plugins.model import Filter, Picker, Scorer
from router.plugins.registry import FILTER, PICKER, SCORER, UnknownPlugin
from router.plugins.spec import PluginSpec

DEFAULT_FILTERS = ("health-filter", "drain-filter", "role-filter", "slo-class-filter", "seq-headroom-filter",
                   "context-filter")
DEFAULT_PICKER = "max-score-picker"

FilterEntry = str | PluginSpec
ScorerEntries = Mapping[str, float | PluginSpec] | Sequence[PluginSpec]


def _spec(entry: str | PluginSpec) -> PluginSpec:
    return PluginSpec(name=entry) if isinstance(entry, str) else entry


def _scorer_specs(scorers: ScorerEntries) -> list[tuple[str, PluginSpec]]:
    """(config path suffix, spec) per scorer, whichever form the config used."""
    if isinstance(scorers, Mapping):
        out = []
        for name, value in scorers.items():
            if isinstance(value, PluginSpec):
                out.append((f".{name}", PluginSpec(name=name, weight=value.weight, parameters=value.parameters)))
            else:
                out.append((f".{name}", PluginSpec(name=name, weight=float(value))))
        return out
    return [(f"[{i}]", s) for i, s in enumerate(scorers)]


class Profile:
    """Filters, weighted scorers and a picker, built. `filters`, `scorers` and `picker` say what
    it was made of (names, name -> weight); `filter_plugins`, `scorer_plugins`, `picker_plugin`
    are what `decide` runs. Raises ValueError naming `where` and every problem at once."""

    def __init__(self, *, filters: Sequence[FilterEntry] = DEFAULT_FILTERS, scorers: ScorerEntries | None = None,
                 picker: str | PluginSpec = DEFAULT_PICKER, where: str = "profile") -> None:
        problems: list[str] = []
        unknown: list[str] = []
        built_filters: list[tuple[str, Filter]] = []
        for i, entry in enumerate(filters):
            spec = _spec(entry)
            plugin = _build(spec, FILTER, _at(where, f"filters[{i}]"), problems, unknown)
            if isinstance(plugin, Filter):
                built_filters.append((spec.name, plugin))
        built_scorers: list[tuple[str, Scorer, float]] = []
        for suffix, spec in _scorer_specs({"queue-depth-scorer": 1.0} if scorers is None else scorers):
            at = _at(where, f"scorers{suffix}")
            plugin = _build(spec, SCORER, at, problems, unknown)
            if not math.isfinite(spec.weight):
                problems.append(f"{at}: the weight must be a finite number, got {spec.weight}")
            elif any(name == spec.name for name, _, _ in built_scorers):
                problems.append(f"{at}: {spec.name} is listed twice")
            elif isinstance(plugin, Scorer):
                built_scorers.append((spec.name, plugin, spec.weight))
        picker_spec = _spec(picker)
        built_picker = _build(picker_spec, PICKER, _at(where, "picker"), problems, unknown)
        if unknown:
            known = ", ".join(registry.PLUGINS)
            problems.insert(0, f"{where + ': ' if where else ''}unknown routing plugins {unknown} (known: {known})")
        if problems or not isinstance(built_picker, Picker):
            raise ValueError("; ".join(problems))
        self.filters: tuple[str, ...] = tuple(name for name, _ in built_filters)
        self.scorers: dict[str, float] = {name: weight for name, _, weight in built_scorers}
        self.picker: str = picker_spec.name
        self.filter_plugins: tuple[tuple[str, Filter], ...] = tuple(built_filters)
        self.filter_fns: tuple[Filter, ...] = tuple(f for _, f in built_filters)
        self.usable_only = self.filters == DEFAULT_FILTERS and all(
            not _spec(f).parameters for f in filters)
        """The default filters as configured: `filters.usable_of` runs them in one comprehension."""
        self.scorer_plugins: tuple[tuple[str, Scorer, float], ...] = tuple(built_scorers)
        self.picker_plugin: Picker = built_picker
        self.where = where

    def __repr__(self) -> str:
        return f"Profile(filters={self.filters!r}, scorers={self.scorers!r}, picker={self.picker!r})"


def _at(where: str, part: str) -> str:
    """A config path: `where` (empty at the top) then `part`."""
    return f"{where}.{part}" if where else part


def _build(spec: PluginSpec, kind: str, where: str, problems: list[str], unknown: list[str]
           ) -> registry.Plugin | None:
    try:
        return registry.build(spec, kind, where)
    except UnknownPlugin:
        unknown.append(spec.name)
    except ValueError as err:
        problems.append(str(err))
    return None


def check_profile(profile: Profile) -> None:
    """A profile is checked as it is built (unknown plugins and bad parameters raise there);
    kept so that callers that build then check read as before."""
