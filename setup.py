"""Builds the request path (wire.native.COMPILED) into C extensions with mypyc when mypyc is
importable (the Makefile installs it, then builds without isolation so mypy sees the installed
packages). Without mypyc (a plain isolated `pip install`) nothing changes; with ISLE_COMPILE=0,
or if the build fails, the package is plain Python and runs the same source interpreted, and
the manifest says so (the next `make` target tries again: wire/build.py). Metadata lives in
pyproject.toml."""

from __future__ import annotations

import json
import os
import runpy
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
NATIVE: dict[str, Any] = runpy.run_path(str(HERE / "wire" / "native.py"))
BUILT_FROM: dict[str, Any] = {}
"""The sources' fingerprint taken before compiling (an edit during the build makes it stale)."""


def _say(message: str) -> None:
    print(f"isleserve: {message}", file=sys.stderr)


def _remove_built(root: Path) -> None:
    for found in NATIVE["extensions"](root):
        found.unlink()
    (root / "wire" / NATIVE["MANIFEST"]).unlink(missing_ok=True)


def _write_manifest(root: Path, failed: str = "") -> None:
    manifest = root / "wire" / NATIVE["MANIFEST"]
    manifest.parent.mkdir(parents=True, exist_ok=True)
    record = {**(BUILT_FROM or NATIVE["fingerprint"](HERE)), **({"failed": failed} if failed else {})}
    manifest.write_text(json.dumps(record, indent=1) + "\n")


class BuildExt(build_ext):
    """Compiles in parallel (every C file of an extension at once: mypyc writes one file per
    module, `multi_file`); a failed C build leaves a plain-Python install, not a broken one."""

    def build_extensions(self) -> None:
        compile_one = self.compiler.compile
        workers = self.parallel if isinstance(self.parallel, int) and self.parallel > 1 else 1

        def compile_all(sources: list[str], *args: Any, **kwargs: Any) -> list[str]:
            if workers == 1 or len(sources) < 2:
                return list(compile_one(sources, *args, **kwargs))
            with ThreadPoolExecutor(workers) as pool:  # each file is its own compiler process
                done = list(pool.map(lambda src: compile_one([src], *args, **kwargs), sources))
            return [obj for objs in done for obj in objs]

        self.compiler.compile = compile_all
        super().build_extensions()

    def run(self) -> None:
        self.parallel = os.cpu_count() or 1
        target = HERE if self.inplace else Path(self.build_lib)
        if not self.extensions:
            return
        try:
            super().run()
        except Exception as err:  # compiler missing, headers missing: run interpreted
            _say(f"compiling the request path failed ({err}): it runs interpreted")
            _remove_built(target)
            _write_manifest(target, failed=str(err) or type(err).__name__)
            return
        _write_manifest(target)


def extensions() -> list[Any]:
    if os.environ.get("ISLE_COMPILE", "1") == "0":
        _remove_built(HERE)
        _write_manifest(HERE, failed="ISLE_COMPILE=0")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _say("mypyc is not installed: the request path is not compiled by this build")
        return []
    BUILT_FROM.update(NATIVE["fingerprint"](HERE))
    _remove_built(HERE)  # leftovers of modules no longer compiled would shadow their sources
    sources = [str(NATIVE["source"](m, Path("."))) for m in NATIVE["COMPILED"]]
    try:
        built = list(mypycify(sources, opt_level="3", group_name=NATIVE["GROUP"], multi_file=True))
    except (Exception, SystemExit) as err:
        _say(f"mypyc could not compile the request path ({err}): it runs interpreted")
        _write_manifest(HERE, failed=f"mypyc: {err}")
        return []
    # mypyc writes a dotted group's header beside its package (build/wire/) but the per-module
    # files of `multi_file` to build/, including it by name: let them find it
    header_dir = str(Path("build", *NATIVE["GROUP"].split(".")[:-1]))
    for ext in built:
        ext.include_dirs.append(header_dir)
    return built


BUILDS = {"build", "build_ext", "bdist_wheel", "editable_wheel", "develop", "install"}
"""Commands that compile: metadata-only runs (egg_info, sdist) skip mypyc's type check."""
setup(ext_modules=extensions() if BUILDS & set(sys.argv[1:]) else [], cmdclass={"build_ext": BuildExt})
