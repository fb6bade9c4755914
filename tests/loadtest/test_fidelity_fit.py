"""The cost model runs on its free constants fitted to every shipped published point
(`physics/data/fitted.yaml`, `physics.fitted`), and every fit starts from the priors, the
literals: the shipped file is what `python -m pools fidelity --fit --write` writes for the data
in the repository, and the leave-one-source-out figure never starts from values that have seen
the source it holds out."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from loadtest.fidelity import constants, fit
from loadtest.fidelity import report as fidelity
from loadtest.fidelity.cli import write_fit
from loadtest.fidelity.predict import predict
from physics import fitted
from tests.conftest import ROOT

pytestmark = pytest.mark.unit


def _shipped() -> dict[str, float]:
    return {row["name"]: float(row["value"]) for row in yaml.safe_load(fitted.FILE.read_text())["constants"]}


def test_the_model_runs_on_the_shipped_fit_of_the_shipped_data(tmp_path: Path) -> None:
    shipped = _shipped()
    assert set(shipped) == {c.name for c in constants.FREE}
    running = constants.defaults()
    for name, value in shipped.items():
        assert running[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name
    points = [p for p in fidelity.points() if fit.fittable(p, predict)]
    found = fit.fit(points, predict)
    assert write_fit(found.values, len(points), found.loss, tmp_path / "fitted.yaml").read_text() \
        == fitted.FILE.read_text(), "physics/data/fitted.yaml is stale: run `python -m pools fidelity --fit --write`"


def test_every_fit_starts_from_the_priors_not_the_shipped_values() -> None:
    priors = constants.priors()
    moved = [name for name, value in _shipped().items() if abs(value - priors[name]) > 1e-3 * max(abs(value), 1e-9)]
    assert len(moved) >= 10  # the fit moved many literals: the priors are still there to start from
    with constants.applied(priors):
        assert constants.defaults() == pytest.approx(priors)
    assert constants.defaults() == pytest.approx(_shipped(), rel=1e-9, abs=1e-12)


def test_the_docs_table_is_the_shipped_file() -> None:
    """docs/costmodel.md's table of constants (prior, shipped) is physics/data/fitted.yaml."""
    text = (ROOT / "docs" / "costmodel.md").read_text()
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`") and cells[1].startswith("`") and ":" in cells[1]:
            rows[cells[0].strip("`")] = (cells[2], cells[3])
    priors, shipped = constants.priors(), _shipped()
    assert set(rows) == set(shipped), "docs/costmodel.md's table of constants lists other constants"
    for name, (prior, value) in rows.items():
        assert (prior, value) == (f"{priors[name]:.4g}", f"{shipped[name]:.4g}"), name
