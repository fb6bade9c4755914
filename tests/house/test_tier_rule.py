"""The tier rule of tests/conftest.py: a test without a tier marker fails collection, naming its
file, even when `-m` would have deselected it (otherwise it would silently run in no tier)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, TIERS

pytestmark = pytest.mark.unit

FILES = {
    "test_untiered.py": "def test_x() -> None:\n    pass\n",
    "test_slow_only.py": "pytestmark = pytest.mark.slow\n\ndef test_x() -> None:\n    pass\n",
    "test_file_tier.py": "pytestmark = pytest.mark.integration\n\ndef test_x() -> None:\n    pass\n",
    "test_tier_in_a_list.py": "pytestmark = [pytest.mark.slow, pytest.mark.ray]\n\ndef test_x() -> None:\n    pass\n",
    "test_tier_per_test.py": "@pytest.mark.unit\ndef test_x() -> None:\n    pass\n",
}


@pytest.mark.parametrize("args", [(), ("-m", "unit")])
def test_files_without_a_tier_fail_collection_and_are_named(tmp_path: Path, args: tuple[str, ...]) -> None:
    for name, source in FILES.items():
        (tmp_path / name).write_text("import pytest\n\n" + source)
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # only the rule under test, and fast
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "pytest_timeout",
                             "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), "-p", "no:cacheprovider",
                             "--collect-only", "-q", *args, str(tmp_path)],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    named = result.stderr.split(" to ", 1)[-1].strip()
    assert "tests without a tier" in result.stderr and named == "test_slow_only.py, test_untiered.py", result.stderr


def test_every_tier_is_a_registered_marker(pytestconfig: pytest.Config) -> None:
    registered = {line.split(":")[0] for line in pytestconfig.getini("markers")}
    assert registered >= TIERS and "slow" in registered - TIERS
