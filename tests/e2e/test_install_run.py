"""`make run`'s install step (`make install-run`) as a new user meets it: a copy of the project
with no virtual environment, the runtime installed, the request path compiled; a build that
fails is shown with its cause and how to retry, the product then runs interpreted, and the next
`make` target compiles it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _copy_project(dest: Path) -> Path:
    """The project's files as a fresh clone of this working tree has them (no .venv, no build)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def _make(project: Path, *extra_env: tuple[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH", "ISLE_"))}
    env.update(extra_env)
    python = shutil.which("python3.11") or sys.executable
    return subprocess.run(["make", "--no-print-directory", "install-run", f"PYTHON={python}"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=1200, check=False)


def _state(project: Path) -> str:
    code = "import wire.native as n, router.server as s; print(n.explain(), s.__file__.rsplit('.', 1)[-1])"
    return subprocess.run([str(project / ".venv/bin/python"), "-c", code], cwd=project, capture_output=True, text=True,
                          timeout=120, check=True).stdout.strip()


@pytest.mark.timeout(1800)
def test_a_failed_build_is_loud_and_the_next_make_compiles(tmp_path: Path) -> None:
    project = _copy_project(tmp_path / "isleserve")
    # no C compiler that works: the runtime installs, the build fails, and make says so
    failed = _make(project, ("CC", "false"), ("LDSHARED", "false"))
    assert failed.returncode == 0, failed.stderr[-3000:]
    assert "the request path was NOT compiled" in failed.stderr, failed.stderr[-3000:]
    assert "`make install-run` (or any make target) compiles again" in failed.stderr
    assert (project / "out/native-build.log").stat().st_size > 0
    assert _state(project).startswith("interpreted (the build failed"), _state(project)
    assert not (project / ".venv/lib/python3.11/site-packages/pytest").exists()  # the runtime only

    retried = _make(project)
    assert retried.returncode == 0, retried.stderr[-3000:]
    assert "request path compiled" in retried.stderr, retried.stderr[-3000:]
    assert _state(project) == "compiled so", _state(project)

    again = _make(project)  # up to date now: nothing is built
    assert again.returncode == 0 and "compiling" not in again.stderr, again.stderr[-3000:]
