"""The cost model's shipped constants. Each free constant (an efficiency or a fixed cost of one
mechanism; `loadtest.fidelity.constants` lists them, with their ranges and mechanisms) is written
in its module at the prior its docstring derives from its sources. The values the model runs on
are those priors fitted to every published point at once (`physics/data/fitted.yaml`, written by
`python -m pools fidelity --fit --write`); `apply` puts them in place when the package loads, and
`PRIORS` keeps the literals: every fit starts from them, so that the leave-one-source-out figure
measures the fitting procedure, not values that have seen the held-out source.

A constant is named by where it lives, `module:attribute` of this package, with `[key]` for a
table entry and `.field` for a field of a frozen dataclass: `costmodel:DEFAULT.prefill_mfu`,
`collectives:BUS_EFFICIENCY[nvlink]`, `a2akernels:KERNELS[pplx].bandwidth_factor`,
`catalog:gpus()[h100-sxm].serving_share` (the catalogue's cached table of parts). An entry for a
module outside this package (`OUTSIDE`: the fidelity harness's `predict:VLLM_PD_PATH_MS`) is left
to that module (`apply(module=..., name=...)`). A kernel whose only priced source runs it on a transport the model
does not price is not a free constant, so it keeps its family's figures (`deepep-v2`,
`loadtest.fidelity.constants.FREE`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

FILE = Path(__file__).parent / "data" / "fitted.yaml"
OUTSIDE = ("predict",)
"""Modules named in the file that are not this package's (the fidelity harness's): left to them;
every other entry names a module of this package."""
PRIORS: dict[str, float] = {}
"""Each applied constant's literal (its prior), by where it lives, before `apply` replaced it."""


def _parse(where: str, module: ModuleType | None = None) -> tuple[Any, str, str | None, str | None]:
    name, path = where.split(":", 1)
    mod = module if module is not None else importlib.import_module(f"physics.{name}")
    if path.startswith("gpus()"):
        path = path.replace("gpus()", "_GPUS_TABLE", 1)
    field = None
    if "." in path:
        path, field = path.split(".", 1)
    key = None
    if path.endswith("]"):
        path, key = path[:-1].split("[", 1)
    return mod, path, key, field


def _table(mod: Any, attr: str) -> Any:
    return mod.gpus() if attr == "_GPUS_TABLE" else getattr(mod, attr)


def get(where: str, module: ModuleType | None = None) -> float:
    """The constant's current value (`module`: the module it names, when not one of this package's)."""
    mod, attr, key, field = _parse(where, module)
    obj = _table(mod, attr)
    if key is not None:
        obj = obj[key]
    return float(getattr(obj, field) if field is not None else obj)


def put(where: str, value: float, module: ModuleType | None = None) -> None:
    """Set the constant where it lives (callers clear the caches that hold results computed with it)."""
    mod, attr, key, field = _parse(where, module)
    if key is None and field is None:
        setattr(mod, attr, value)
        return
    if key is None:
        # a frozen dataclass instance shared by default arguments: changed in place, so that every
        # function that took it as its default sees the new value
        object.__setattr__(getattr(mod, attr), field or "", value)
        return
    table = _table(mod, attr)
    table[key] = dataclasses.replace(table[key], **{field: value}) if field is not None else value


@functools.cache
def load(path: Path = FILE) -> dict[str, float]:
    """The shipped values by where they live (none when the file is absent)."""
    if not path.exists():
        return {}
    data = yaml.safe_load(path.read_text()) or {}
    constants = data.get("constants") or []
    if not isinstance(constants, list):
        raise ValueError(f"{path}: 'constants' is a list of {{name, where, value}}")
    out: dict[str, float] = {}
    for entry in constants:
        where, value = entry.get("where"), entry.get("value")
        if not isinstance(where, str) or not isinstance(value, int | float) or value < 0:
            raise ValueError(f"{path}: bad entry {entry!r}")
        out[where] = float(value)
    return out


def apply(values: Mapping[str, float] | None = None, module: ModuleType | None = None, name: str = "") -> None:
    """Put the shipped values (default: `FILE`) in place of the literals, once: this package's, or
    with `module` those of that module, named `name` in the file (one of `OUTSIDE`)."""
    for where, value in (load() if values is None else values).items():
        owner = where.split(":", 1)[0]
        if (owner != name if module is not None else owner in OUTSIDE) or where in PRIORS:
            continue
        PRIORS[where] = get(where, module)
        put(where, value, module)
