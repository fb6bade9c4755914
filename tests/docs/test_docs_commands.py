"""Every command of the docs' `sh` blocks runs for real and exits 0 (tests/docs/mdblocks.py gives
the convention; the long-running ones are `sh parse-only` and tests/docs/test_docs_parse.py
checks them). Each runs in bash from the repository root with .venv/bin first on PATH, as a
user who followed the quickstart would, within TIMEOUT_S. Each command stands alone (a line that
needs an earlier one chains it with `&&`), so the order and parallelism of the run do not matter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.mdblocks import ROOT, Command, commands

pytestmark = pytest.mark.integration

TIMEOUT_S = 60.0
RUN = commands("sh")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{ROOT / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    return env


@pytest.mark.parametrize("command", RUN, ids=lambda c: c.id)
def test_doc_command_runs(command: Command) -> None:
    done = subprocess.run(["bash", "-o", "pipefail", "-c", command.text], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert done.returncode == 0, (f"{command.id}: `{command.text}` exited {done.returncode}\n"
                                  f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
