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

from wire import build, native

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


def test_a_failed_build_is_tried_again_and_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _tree(tmp_path, build=False)
    failed = {**native.fingerprint(tmp_path), "failed": "error: command 'false' failed with exit code 1"}
    (tmp_path / "wire" / native.MANIFEST).write_text(json.dumps(failed))
    assert native.judge(tmp_path) == "interpreted" and not native.up_to_date(tmp_path)  # the next make builds
    assert native.explain(tmp_path) == ("interpreted (the build failed: error: command 'false' failed with exit "
                                        "code 1; `make install-run` tries again)")
    log = tmp_path / "build.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)) + "error: command 'false' failed\n")
    assert build.report(log, 0, tmp_path) == 0  # the product runs interpreted: make goes on
    said = capsys.readouterr().err
    assert "the request path was NOT compiled" in said and "why: error: command 'false'" in said
    assert "  error: command 'false' failed" in said and "line 99" in said and "line 50" not in said  # the tail
    assert "`make install-run` (or any make target) compiles again" in said
    assert build.report(log, 1, tmp_path) == 1 and "`pip install -e .` exited 1" in capsys.readouterr().err


def test_a_build_that_compiled_says_so_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _tree(tmp_path)
    assert build.report(tmp_path / "absent.log", 0, tmp_path) == 0
    assert capsys.readouterr().err == f"isleserve: request path compiled (mypyc: {len(native.COMPILED)} modules)\n"
    assert native.explain(tmp_path) == "compiled"
    _edit(tmp_path, "router.auth")
    assert native.explain(tmp_path) == "interpreted (built from other sources; `make install-run` recompiles)"


def test_interpreted_on_request_loads_the_python_sources() -> None:
    code = ("import wire.native as n, router.server as s, wire.http as h, router.metrics as m; "
            "print(n.state(), s.__file__.endswith('.py'), h.__file__.endswith('.py'), "
            "'isle_router_build_info{native=\"interpreted\"} 1.0' in m.RouterMetrics().render().decode())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, native.ENV: "1"}).stdout.split()
    assert out == ["interpreted", "True", "True", "True"]


CC = (sysconfig.get_config_var("CC") or "cc").split()[0]


@pytest.mark.skipif(not os.environ.get("CI") or shutil.which(CC) is None,
                    reason="CI with a C compiler builds the compiled request path (make test)")
def test_ci_runs_the_compiled_request_path() -> None:
    assert native.state() == "compiled"
    import router.server
    from router.metrics import RouterMetrics

    assert not router.server.__file__.endswith(".py")
    assert 'isle_router_build_info{native="compiled"} 1.0' in RouterMetrics().render().decode()  # what a scrape says
