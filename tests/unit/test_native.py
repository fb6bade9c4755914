"""The compiled request path: runs compiled only from the sources it was built from; otherwise the
same `.py` runs interpreted. CI (which builds with `make test`) must run the compiled one."""

from __future__ import annotations

import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pools import native

pytestmark = pytest.mark.unit
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def _tree(root: Path, build: bool = True) -> None:
    for module in native.COMPILED:
        src = native.source(module, root)
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_text(f"# {module}\n")
        if build:
            src.with_name(src.stem + SUFFIX).write_bytes(b"")
    if build:
        (root / "pools" / native.MANIFEST).write_text(json.dumps(native.manifest(root)))


def test_a_tree_built_from_its_sources_runs_compiled(tmp_path: Path) -> None:
    _tree(tmp_path)
    assert native.judge(tmp_path) == "compiled"
    assert native.judge(tmp_path, forced=True) == "interpreted"


def test_nothing_built_runs_interpreted(tmp_path: Path) -> None:
    _tree(tmp_path, build=False)
    assert native.judge(tmp_path) == "interpreted"


def test_an_edited_source_makes_the_whole_group_stale(tmp_path: Path) -> None:
    _tree(tmp_path)
    edited = native.source("router.decision", tmp_path)
    edited.write_text(edited.read_text() + "x = 1\n")
    assert native.judge(tmp_path) == "stale"


def test_a_half_built_tree_or_a_missing_manifest_is_stale(tmp_path: Path) -> None:
    _tree(tmp_path)
    flight = native.source("router.flight", tmp_path)
    flight.with_name(flight.stem + SUFFIX).unlink()
    assert native.judge(tmp_path) == "stale"
    _tree(tmp_path)
    (tmp_path / "pools" / native.MANIFEST).unlink()
    assert native.judge(tmp_path) == "stale"


def test_interpreted_on_request_loads_the_python_sources() -> None:
    code = ("import pools.native as n, router.server as s, pools.wire.http as h; "
            "print(n.state(), s.__file__.endswith('.py'), h.__file__.endswith('.py'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, native.ENV: "1"}).stdout.split()
    assert out == ["interpreted", "True", "True"]


@pytest.mark.skipif(not os.environ.get("CI") or shutil.which("cc") is None,
                    reason="CI with a C compiler builds the compiled request path (make test)")
def test_ci_runs_the_compiled_request_path() -> None:
    assert native.state() == "compiled"
    import router.server

    assert not router.server.__file__.endswith(".py")
