"""The request path compiled to C with mypyc, from the same typed source (setup.py builds it:
`make install` / `make test` do). Nothing here imports the package: setup.py reads it too.

A compiled module runs only while the sources are the ones it was compiled from: the build
records a digest of every `.py` file of the packages whose types mypyc builds in (`PACKAGES`),
and if any differs now (an edit, another branch, a build that failed half-way) or the group's
library or a module's extension is missing, every module of our packages runs interpreted from
its `.py`, with one warning, until the next build. `ISLE_INTERPRETED=1` forces the interpreter
(for profilers that read Python frames, and to compare).
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
from typing import Any

COMPILED = (
    "loadtest.sim.cluster",
    "loadtest.sim.network",
    "loadtest.sim.replica",
    "physics.collectives",
    "physics.costmodel",
    "physics.flops",
    "physics.kvtransfer",
    "simengine.core",
    "simengine.fastforward",
    "wire.fields",
    "simengine.guided",
    "simengine.metrics",
    "simengine.output",
    "simengine.protocol",
    "simengine.responses",
    "simengine.routes",
    "simengine.serving",
    "wire.text",
    "simengine.tokenize",
    "simengine.tokens",
    "simengine.toolcall",
    "wire.deadline",
    "wire.http",
    "wire.errors",
    "wire.openai",
    "wire.prompt",
    "wire.reader",
    "wire.responder",
    "router.admission",
    "router.auth",
    "router.call",
    "router.cost",
    "router.decision",
    "router.flight",
    "router.generation",
    "router.metrics",
    "router.plugins.filters",
    "router.plugins.model",
    "router.plugins.params",
    "router.plugins.pd",
    "router.plugins.pickers",
    "router.plugins.profile",
    "router.plugins.registry",
    "router.plugins.scorers",
    "router.plugins.timing",
    "router.plugins.ttft",
    "router.quota",
    "router.relay",
    "router.server",
    "router.state",
    "router.timing",
)
"""The request path: HTTP server, upstream relay, auth, admission, decision, relay, metrics; and the
offline simulator's hot loop (its event loop, the engine's scheduler, the cost model), which runs
the same decision code. One group (one shared library, `wire/_native__mypyc`), so calls between
them are C calls. Compiled, the simulator runs 1.9x as fast (simbench's sample: 17.8 -> 9.4 s of
CPU, the same results)."""
GROUP = "wire._native"
PACKAGES = ("topology", "wire", "physics", "pools", "simengine", "router", "control", "isleserve", "loadtest")
"""Where the compiled modules' types come from (each layer may import those below it): a change to
any of their sources can change what the compiled code expects."""
ALL_PACKAGES = ("topology", "wire", "physics", "pools", "simengine", "router", "control", "isleserve", "loadtest")
MANIFEST = "_native.json"
ENV = "ISLE_INTERPRETED"
ROOT = Path(__file__).resolve().parent.parent


def source(module: str, root: Path = ROOT) -> Path:
    return root.joinpath(*module.split(".")).with_suffix(".py")


def sources(root: Path = ROOT) -> list[Path]:
    return sorted(p for package in PACKAGES for p in (root / package).rglob("*.py"))


def fingerprint(root: Path = ROOT) -> dict[str, Any]:
    """What a build is built from: one digest of every source in PACKAGES, and each file's size
    and mtime (a quick check that skips hashing when nothing was touched)."""
    files = sources(root)
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return {"digest": digest.hexdigest(), "stats": _stats(root, files)}


def _stats(root: Path, files: list[Path]) -> dict[str, list[int]]:
    out = {}
    for path in files:
        st = path.stat()
        out[str(path.relative_to(root))] = [st.st_size, st.st_mtime_ns]
    return out


def extensions(root: Path = ROOT) -> list[Path]:
    """Every extension module in our packages' folders (the group's library included)."""
    return sorted({p for package in ALL_PACKAGES for suffix in importlib.machinery.EXTENSION_SUFFIXES
                   for p in (root / package).rglob("*" + suffix)})


def _module_of(path: Path, root: Path) -> str:
    suffix = max((s for s in importlib.machinery.EXTENSION_SUFFIXES if path.name.endswith(s)), key=len)
    return ".".join((*path.parent.relative_to(root).parts, path.name.removesuffix(suffix)))


def read_manifest(root: Path = ROOT) -> dict[str, Any]:
    try:
        found = json.loads((root / "wire" / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def up_to_date(root: Path = ROOT) -> bool:
    """The last build compiled these very sources: nothing to build (the Makefile asks). A build
    that failed is not up to date: the next `make` target tries again, and shows why if it fails."""
    return judge(root) == "compiled"


def _same_sources(recorded: dict[str, Any], root: Path) -> bool:
    files = sources(root)
    if recorded.get("stats") == _stats(root, files):
        return True
    return bool(recorded.get("digest") == fingerprint(root)["digest"])


def judge(root: Path = ROOT, forced: bool = False) -> str:
    """'compiled' when every module of the group and the group's library are built from the
    present sources and nothing else is; 'interpreted' when nothing is built (or `forced`);
    else 'stale'."""
    found = {_module_of(p, root) for p in extensions(root)}
    if not found or forced:
        return "interpreted"
    recorded = read_manifest(root)
    if (not recorded or recorded.get("failed") or found != {*COMPILED, GROUP + "__mypyc"}
            or not _same_sources(recorded, root)):
        return "stale"
    return "compiled"


class _Interpreted(importlib.abc.MetaPathFinder):
    """Finds our modules' `.py` sources ahead of any extension module beside them."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] not in ALL_PACKAGES or "." not in fullname:
            return None
        file = source(fullname, self.root)
        if not file.is_file():  # a package (its __init__.py) or not ours: the usual finders
            return None
        return importlib.util.spec_from_file_location(fullname, file)


_decided: dict[str, str] = {}


def ensure() -> str:
    """Decide once per process, before any compiled module is imported (the package __init__
    modules call it): anything but 'compiled' puts the `.py` sources ahead of the extensions."""
    if "state" not in _decided:
        _decided["state"] = state = judge(forced=os.environ.get(ENV, "") not in ("", "0"))
        if state != "compiled" and extensions():
            sys.meta_path.insert(0, _Interpreted(ROOT))
        if state == "stale":
            print("isleserve: the compiled request path does not match the sources: running it "
                  "interpreted (slower); `make install-run` or `make install` recompiles", file=sys.stderr)
    return _decided["state"]


def state() -> str:
    """How this process runs the request path: 'compiled', 'interpreted' or 'stale'."""
    return ensure()


def explain(root: Path = ROOT) -> str:
    """`compiled`, or `interpreted (why; what to do)`: the start-up line's words. For this
    process (as `ensure` decided) when `root` is the package's own tree."""
    now = state() if root == ROOT else judge(root)
    if now == "compiled":
        return "compiled"
    failed = str(read_manifest(root).get("failed") or "")
    if root == ROOT and os.environ.get(ENV, "") not in ("", "0"):
        why = f"{ENV} is set"
    elif failed:
        why = f"the build failed: {failed.strip().splitlines()[0][:200]}; `make install-run` tries again"
    elif now == "stale":
        why = "built from other sources; `make install-run` recompiles"
    else:
        why = "not compiled; `make install-run` compiles it"
    return f"interpreted ({why})"
