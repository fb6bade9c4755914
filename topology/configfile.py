"""Config files for every layer: YAML read and validated into a pydantic model, with the one-line
errors every CLI prints.

The lowest layer holds these so that `pools`, `router` and `loadtest` read their files the same
way without reaching into a topology reader. Every problem in a document is reported at once,
each with its path (`pools[1].replica.tp`), as one `ParseError` line naming the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from topology.errors import ParseError

_M = TypeVar("_M", bound=BaseModel)


def load_yaml_file(path: str, what: str) -> object:
    """The parsed document, or ParseError naming the file and what it was meant to be."""
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ParseError(f"cannot read {what}: {err.strerror}", path) from None
    except UnicodeDecodeError as err:
        raise ParseError(f"{what} is not UTF-8 text (byte {err.start})", path) from None
    return parse_yaml_text(text, what, path)


def parse_yaml_text(text: str, what: str, where: str | None = None) -> object:
    """`text` parsed as YAML, or ParseError with the parser's first line."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ParseError(f"{what} is not valid YAML ({str(err).splitlines()[0]})", where) from None


def format_validation(err: ValidationError) -> str:
    """Every problem pydantic found, as `path: message; path: message` on one line."""
    parts = []
    for e in err.errors():
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e["loc"]).lstrip(".")
        parts.append(f"{where or 'spec'}: {e['msg']}")
    return "; ".join(parts).replace("\r", "\\r").replace("\n", "\\n")  # one line, whatever the input's keys


def validate_mapping(model: type[_M], raw: object, what: str, shape: str, where: str | None = None) -> _M:
    """`raw` (parsed YAML) as `model`, or one ParseError naming every problem at once; `shape`
    is the error when `raw` is not a mapping at all."""
    if not isinstance(raw, dict):
        raise ParseError(shape, where)
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        raise ParseError(f"invalid {what}: {format_validation(err)}", where) from None
