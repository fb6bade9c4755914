"""The compiled request path: runs compiled only from the sources it was built from; otherwise the
same `.py` runs interpreted. CI (which builds with `make test`) must run the compiled one."""

from __future__ import annotations

import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from wire import native

pytestmark = pytest.mark.unit
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def _tree(root: Path, build: bool = True) -> None:
    for module in (*native.COMPILED, "topology.model", "pools.model"):
        src = native.source(module, root)
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_text(f"# {module}\n")
    if build:
        for module in (*native.COMPILED, native.GROUP + "__mypyc"):
            src = native.source(module, root)
            src.with_name(src.stem + SUFFIX).write_bytes(b"")
        (root / "wire" / native.MANIFEST).write_text(json.dumps(native.fingerprint(root)))


def _edit(root: Path, module: str) -> None:
    src = native.source(module, root)
    src.write_text(src.read_text() + "x = 1\n")


def test_a_tree_built_from_its_sources_runs_compiled(tmp_path: Path) -> None:
    _tree(tmp_path)
    assert native.judge(tmp_path) == "compiled" and native.up_to_date(tmp_path)
    assert native.judge(tmp_path, forced=True) == "interpreted"


def test_nothing_built_runs_interpreted(tmp_path: Path) -> None:
    _tree(tmp_path, build=False)
    assert native.judge(tmp_path) == "interpreted" and not native.up_to_date(tmp_path)


@pytest.mark.parametrize("module", ["router.decision", "pools.model", "topology.model"])
def test_an_edited_source_makes_the_whole_group_stale(tmp_path: Path, module: str) -> None:
    """A compiled module's own source, or one whose types mypyc built in (pools, topology)."""
    _tree(tmp_path)
    _edit(tmp_path, module)
    assert native.judge(tmp_path) == "stale" and not native.up_to_date(tmp_path)


def test_touched_but_unchanged_sources_stay_compiled(tmp_path: Path) -> None:
    _tree(tmp_path)
    src = native.source("router.server", tmp_path)
    os.utime(src, ns=(src.stat().st_atime_ns, src.stat().st_mtime_ns + 10**9))
    assert native.judge(tmp_path) == "compiled"


def _extension(root: Path, module: str) -> Path:
    src = native.source(module, root)
    return src.with_name(src.stem + SUFFIX)


def test_a_half_built_tree_a_missing_library_or_manifest_or_a_leftover_is_stale(tmp_path: Path) -> None:
    _tree(tmp_path)
    _extension(tmp_path, "router.flight").unlink()
    assert native.judge(tmp_path) == "stale"
    _tree(tmp_path)
    _extension(tmp_path, native.GROUP + "__mypyc").unlink()
    assert native.judge(tmp_path) == "stale"
    _tree(tmp_path)
    (tmp_path / "wire" / native.MANIFEST).unlink()
    assert native.judge(tmp_path) == "stale"
    _tree(tmp_path)
    _extension(tmp_path, "pools.model").write_bytes(b"")  # a module compiled by an older build
    assert native.judge(tmp_path) == "stale"


def test_a_failed_build_is_not_retried_until_the_sources_change(tmp_path: Path) -> None:
    _tree(tmp_path, build=False)
    (tmp_path / "wire" / native.MANIFEST).write_text(json.dumps({**native.fingerprint(tmp_path), "failed": "no cc"}))
    assert native.judge(tmp_path) == "interpreted" and native.up_to_date(tmp_path)
    _edit(tmp_path, "router.auth")
    assert not native.up_to_date(tmp_path)


def test_interpreted_on_request_loads_the_python_sources() -> None:
    code = ("import wire.native as n, router.server as s, wire.http as h; "
            "print(n.state(), s.__file__.endswith('.py'), h.__file__.endswith('.py'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, native.ENV: "1"}).stdout.split()
    assert out == ["interpreted", "True", "True"]


CC = (sysconfig.get_config_var("CC") or "cc").split()[0]


@pytest.mark.skipif(not os.environ.get("CI") or shutil.which(CC) is None,
                    reason="CI with a C compiler builds the compiled request path (make test)")
def test_ci_runs_the_compiled_request_path() -> None:
    assert native.state() == "compiled"
    import router.server

    assert not router.server.__file__.endswith(".py")
