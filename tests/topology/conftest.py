"""The topology package's test kit: its command line as a user runs it."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run `python -m topology ...` as a user would; never raises on a non-zero exit."""
    return subprocess.run(
        [sys.executable, "-m", "topology", *args],
        cwd=ROOT, capture_output=True, text=True, input=stdin, timeout=120, check=False,
    )
