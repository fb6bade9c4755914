"""A plugin's `parameters` as the plugin reads them: each read checks type and range and names
the parameter by its config path; `done()` raises one error with every problem, unknown
parameters included (a typo is an error, not a silently ignored key)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


class Params:
    def __init__(self, raw: Mapping[str, object], where: str) -> None:
        self.raw = raw
        self.where = where
        """The config path of the parameters (`profiles.interactive.scorers[0].parameters`)."""
        self.read: set[str] = set()
        self.problems: list[str] = []

    def _get(self, key: str) -> object | None:
        self.read.add(key)
        return self.raw.get(key)

    def number(self, key: str, default: float, low: float = -math.inf, high: float = math.inf) -> float:
        value = self._get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            self.problems.append(f"{self.where}.{key}: must be a finite number, got {value!r}")
            return default
        if not low <= value <= high:
            self.problems.append(f"{self.where}.{key}: must be within [{low}, {high}], got {value!r}")
            return default
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self._get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.problems.append(f"{self.where}.{key}: must be true or false, got {value!r}")
            return default
        return value

    def choice(self, key: str, default: str | None, choices: Sequence[str]) -> str | None:
        value = self._get(key)
        if value is None:
            return default
        if not isinstance(value, str) or value not in choices:
            self.problems.append(f"{self.where}.{key}: must be one of {list(choices)}, got {value!r}")
            return default
        return value

    def numbers(self, key: str, default: Mapping[str, float], low: float, high: float) -> dict[str, float]:
        """A mapping of names to numbers (given entries replace the defaults' of the same name)."""
        value = self._get(key)
        out = dict(default)
        if value is None:
            return out
        if not isinstance(value, Mapping):
            self.problems.append(f"{self.where}.{key}: must be a mapping of names to numbers, got {value!r}")
            return out
        inner = Params({str(k): v for k, v in value.items()}, f"{self.where}.{key}")
        for name in inner.raw:
            out[name] = inner.number(name, out.get(name, low), low, high)
        self.problems.extend(inner.problems)
        return out

    def done(self) -> None:
        unknown = sorted(str(k) for k in self.raw if k not in self.read)
        if unknown:
            self.problems.append(f"{self.where}: unknown parameters {unknown} (known: {sorted(self.read) or 'none'})")
        if self.problems:
            raise ValueError("; ".join(self.problems))
