"""Published points as the fidelity report prices them, picked by id (tests of the cost model
against named points)."""

from __future__ import annotations

from loadtest.fidelity import report as fidelity


def picked(*ids: str) -> dict[str, fidelity.Row]:
    """The report's rows for these point ids; every id must name a point."""
    found = {r.id: r for r in fidelity.rows() if r.id in ids}
    assert set(found) == set(ids), sorted(set(ids) - set(found))
    return found
