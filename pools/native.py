"""The request path compiled to C with mypyc, from the same typed source (setup.py builds it:
`make install` / `make test` do). Nothing here imports the package: setup.py reads COMPILED.

A compiled module runs only while its source is the one it was compiled from: the build writes
each source's SHA-256 to `_native.json`, and if any source differs now (edited, another branch
checked out, a build that failed half-way) every module of the group runs interpreted from its
`.py`, with one warning, until the next build. `ISLE_INTERPRETED=1` forces the interpreter (for
profilers that read Python frames, and to compare).
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

COMPILED = (
    "pools.engine.text",
    "pools.wire.http",
    "pools.wire.openai",
    "pools.wire.responder",
    "router.admission",
    "router.auth",
    "router.decision",
    "router.flight",
    "router.metrics",
    "router.relay",
    "router.server",
    "router.state",
)
"""The request path: HTTP server, upstream relay, auth, admission, decision, relay, metrics. One group
(one shared library, `pools/_native__mypyc`), so calls between them are C calls."""
GROUP = "pools._native"
MANIFEST = "_native.json"
ENV = "ISLE_INTERPRETED"
ROOT = Path(__file__).resolve().parent.parent


def source(module: str, root: Path = ROOT) -> Path:
    return root.joinpath(*module.split(".")).with_suffix(".py")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def manifest(root: Path = ROOT) -> dict[str, str]:
    """What a build compiled: module -> SHA-256 of its source then."""
    return {m: digest(source(m, root)) for m in COMPILED}


def built(module: str, root: Path = ROOT) -> bool:
    base = source(module, root).with_suffix("")
    return any(base.with_name(base.name + suffix).exists() for suffix in importlib.machinery.EXTENSION_SUFFIXES)


class _Interpreted(importlib.abc.MetaPathFinder):
    """Finds the compiled modules' `.py` sources ahead of their extension modules."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in COMPILED:
            return None
        return importlib.util.spec_from_file_location(fullname, source(fullname, self.root))


def judge(root: Path = ROOT, forced: bool = False) -> str:
    """'compiled' when every module of the group is built from its present source; 'interpreted'
    when none is built (or `forced`); else 'stale'."""
    if not any(built(m, root) for m in COMPILED):
        return "interpreted"
    if forced:
        return "interpreted"
    try:
        recorded = json.loads((root / "pools" / MANIFEST).read_text())
    except (OSError, ValueError):
        return "stale"
    if all(built(m, root) for m in COMPILED) and recorded == manifest(root):
        return "compiled"
    return "stale"


_decided: dict[str, str] = {}


def ensure() -> str:
    """Decide once per process, before any compiled module is imported (the package __init__
    modules call it): anything but 'compiled' puts the `.py` sources ahead of the extensions."""
    if "state" not in _decided:
        _decided["state"] = state = judge(forced=os.environ.get(ENV, "") not in ("", "0"))
        if state != "compiled" and any(built(m) for m in COMPILED):
            sys.meta_path.insert(0, _Interpreted(ROOT))
        if state == "stale":
            print("isleserve: the request path's sources changed since they were compiled: running them "
                  "interpreted (slower); `make install` recompiles", file=sys.stderr)
    return _decided["state"]


def state() -> str:
    """How this process runs the request path: 'compiled', 'interpreted' or 'stale'."""
    return ensure()
