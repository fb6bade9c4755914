from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Ray in tests (set before anything imports ray, which reads them at import): no token auth
# files, no usage stats, and loopback only (otherwise Ray swaps 127.0.0.1 for the machine's
# routable address). Subprocesses (`serve run`, `ray start`) inherit them.
for _key, _value in {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
                     "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}.items():
    os.environ.setdefault(_key, _value)

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("ISLE_SHARED_DATA", ROOT.parent / "shared" / "data"))
TOPO_DIR = SHARED_DATA / "topo"
NCCL_DIR = SHARED_DATA / "nccl-topo"


def captures(pattern: str = "*.txt") -> list[Path]:
    return sorted(TOPO_DIR.glob(pattern)) if TOPO_DIR.is_dir() else []


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip("shared/data is not beside this checkout")
    return SHARED_DATA


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run `python -m topology ...` as a user would; never raises on a non-zero exit."""
    return subprocess.run(
        [sys.executable, "-m", "topology", *args],
        cwd=ROOT, capture_output=True, text=True, input=stdin, timeout=120, check=False,
    )
