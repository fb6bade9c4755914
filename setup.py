"""Builds the request path (pools.native.COMPILED) into C extensions with mypyc when mypyc is
importable (the Makefile installs it, then builds without isolation so mypy sees the installed
packages). Without mypyc, with ISLE_COMPILE=0, or if the C build fails, the package installs
as plain Python and runs the same source interpreted. Metadata lives in pyproject.toml."""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
NATIVE: dict[str, Any] = runpy.run_path(str(HERE / "pools" / "native.py"))


def _say(message: str) -> None:
    print(f"isleserve: {message}", file=sys.stderr)


def _remove_built(root: Path) -> None:
    for module in NATIVE["COMPILED"]:
        base = NATIVE["source"](module, root).with_suffix("")
        for found in base.parent.glob(base.name + ".*.so"):
            found.unlink()
    for found in (root / "pools").glob("_native__mypyc.*.so"):
        found.unlink()
    (root / "pools" / NATIVE["MANIFEST"]).unlink(missing_ok=True)


class BuildExt(build_ext):
    """Compiles in parallel; a failed C build leaves a plain-Python install, not a broken one."""

    def run(self) -> None:
        self.parallel = os.cpu_count() or 1
        target = HERE if self.inplace else Path(self.build_lib)
        try:
            super().run()
        except Exception as err:  # compiler missing, headers missing: run interpreted
            _say(f"compiling the request path failed ({err}): it runs interpreted")
            _remove_built(target)
            return
        if self.extensions:
            manifest = target / "pools" / NATIVE["MANIFEST"]
            manifest.parent.mkdir(parents=True, exist_ok=True)
            manifest.write_text(json.dumps(NATIVE["manifest"](HERE), indent=1) + "\n")


def extensions() -> list[Any]:
    if os.environ.get("ISLE_COMPILE", "1") == "0":
        _remove_built(HERE)
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _say("mypyc is not installed: the request path runs interpreted")
        return []
    sources = [str(NATIVE["source"](m, Path("."))) for m in NATIVE["COMPILED"]]
    try:
        return list(mypycify(sources, opt_level="3", group_name=NATIVE["GROUP"]))
    except (Exception, SystemExit) as err:
        _say(f"mypyc could not compile the request path ({err}): it runs interpreted")
        return []


BUILDS = {"build", "build_ext", "bdist_wheel", "editable_wheel", "develop", "install"}
"""Commands that compile: metadata-only runs (egg_info, sdist) skip mypyc's type check."""
setup(ext_modules=extensions() if BUILDS & set(sys.argv[1:]) else [], cmdclass={"build_ext": BuildExt})
