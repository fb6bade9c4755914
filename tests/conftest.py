"""What every test shares: the repository root, the shared real-machine data (../shared/data, or
$ISLE_SHARED_DATA) and a skip that says so when it is absent, and the tier rule: every test
carries one of TIERS (registered in pyproject.toml), from its file's `pytestmark` as a rule, or
collection fails naming the file.

Tests mirror the code: tests/<package>/ holds the tests of that package, and its conftest.py that
package's fakes and builders; helpers several packages use live in tests/support/ (engines and
routers as processes, the fake Ray cluster, fake NVML, a full disk, `wait_until`, openai clients
that the test's end closes, the stub engines' request reader). Every test's teardown ends by
collecting its garbage: what it left open fails it.
"""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    """Each test's leftovers are found as it ends: once every finalizer of its teardown has run
    (its own fixtures', and its module's or the session's when it is their last test), the openai
    clients it opened are closed (tests/support/clients.py), then its garbage is collected, and
    what the collector could not finalise cleanly (a socket, file or event loop left open: a
    ResourceWarning, an error under pyproject's filterwarnings) fails this test's teardown, not
    whichever test runs when the collector next runs (a failure that moved with xdist's order).
    What survives is frozen (`gc.freeze`): the next collection looks only at what the next test
    made, not again at the whole worker's heap (a full collection after every test doubled the
    unit lane's time)."""
    yield
    found: list[sys.UnraisableHookArgs] = []
    previous, sys.unraisablehook = sys.unraisablehook, found.append  # also what closing may let the collector find
    try:
        clients = sys.modules.get("tests.support.clients")  # imported (with openai) only by the tests that use it
        if clients is not None:
            clients.close_all()
        gc.collect()
    finally:
        sys.unraisablehook = previous
    gc.freeze()
    if found:
        raise AssertionError("left for the garbage collector, not closed:\n" + "\n".join(
            f"{u.err_msg or 'Exception ignored in'}: {u.object!r}: {u.exc_type.__name__}: {u.exc_value}"
            for u in found))


TIERS = frozenset({"unit", "integration", "ray", "e2e", "sim", "vllm", "gpu"})
"""The markers that say what a test file starts (pyproject.toml describes each); `slow` is not one."""


def shared_path(*parts: str) -> Path:
    """A file or folder of the shared data, or a skip that says it is absent and why it matters."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent: these cases read the shared real-machine data "
                    "(../shared/data beside this checkout, or $ISLE_SHARED_DATA)")
    return path


def captures(pattern: str = "*.txt") -> list[Path]:
    """The shared captures matching `pattern`; empty when the shared data is absent (for
    parametrize, see capture_params; for one capture, first_capture)."""
    return sorted(TOPO_DIR.glob(pattern)) if TOPO_DIR.is_dir() else []


def no_captures_reason(pattern: str) -> str:
    return f"{TOPO_DIR} has no {pattern}: these cases read the shared captures (../shared/data/topo)"


def no_captures(pattern: str, arity: int = 1) -> list[Any]:
    """For parametrize when `captures(pattern)` is empty: one skipped case (of `arity` values)
    that says why, instead of pytest's silent "empty parameter set"."""
    return [pytest.param(*([None] * arity), id="no-shared-captures",
                         marks=pytest.mark.skip(reason=no_captures_reason(pattern)))]


def capture_params(pattern: str = "*.txt") -> list[Any]:
    """`captures(pattern)` as parameters named by stem, or one skipped case saying why."""
    return [pytest.param(c, id=c.stem) for c in captures(pattern)] or no_captures(pattern)


def first_capture(pattern: str) -> Path:
    """The first shared capture matching `pattern`, or a skip saying it is absent."""
    found = captures(pattern)
    if not found:
        pytest.skip(no_captures_reason(pattern))
    return found[0]


@pytest.fixture
def shared_data() -> Path:
    return shared_path()


def tiers_of(item: pytest.Item) -> set[str]:
    """The tier markers a test carries (from its file's `pytestmark`, its class or itself)."""
    return {m.name for m in item.iter_markers()} & TIERS


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: an untiered file would vanish from every tier's run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    untiered = sorted({os.path.relpath(item.path, config.rootpath) for item in items if not tiers_of(item)})
    if untiered:
        raise pytest.UsageError("tests without a tier: add `pytestmark = pytest.mark.<tier>` (one of "
                                + ", ".join(sorted(TIERS)) + ") to " + ", ".join(untiered))
