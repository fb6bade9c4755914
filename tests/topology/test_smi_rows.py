"""Every row of `nvidia-smi topo -m` is checked against its header, through `isle topology parse`.

The broken variants are real captures changed the way captures get damaged: the last NIC row
lost, a NIC row cut mid-cell, an unknown code, a cell that disagrees with its mirror, a GPU
row cut after its matrix cells or before its last value; each exits 2 with one line. A blank
`CPU Affinity` cell (Slurm-restricted nodes) and a header whose separators were lost are read.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, captures, no_captures

pytestmark = pytest.mark.unit

SMI = [c for c in captures() if "rocm-smi" not in c.stem]
_WORD = re.compile(r"\S+")


def _isle(*args: str) -> subprocess.CompletedProcess[str]:
    """`isle topology ARGS` as a user runs it; never raises on a non-zero exit."""
    return subprocess.run([sys.executable, "isle.py", "topology", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)


class Capture:
    """A capture's lines, with where its header and matrix rows are."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines = path.read_text().splitlines()
        self.header_at = next(i for i, ln in enumerate(self.lines) if ln.split()[:1] == ["GPU0"])
        fields = re.split(r"\t|\s{2,}", self.lines[self.header_at].strip())
        self.trailers = [f for f in fields if " " in f]
        self.devices = [f for f in fields if " " not in f]
        self.rows = {i: ln.split()[0] for i, ln in enumerate(self.lines)
                     if i > self.header_at and ln.split()[:1] and ln.split()[0] in self.devices}

    def row_at(self, label: str) -> int:
        return next(i for i, name in self.rows.items() if name == label)

    def with_line(self, at: int, line: str | None) -> str:
        lines = list(self.lines)
        if line is None:
            del lines[at]
        else:
            lines[at] = line
        return "\n".join(lines) + "\n"

    def span(self, at: int, word: int) -> tuple[int, int]:
        """Start and end of word number `word` (0: the row label) of line `at`."""
        m = list(_WORD.finditer(self.lines[at]))[word]
        return m.start(), m.end()

    @property
    def nic_rows(self) -> list[str]:
        return [name for name in self.rows.values() if not name.startswith("GPU")]

    def expected(self) -> dict[str, Any]:
        return json.loads(self.path.with_suffix(".expected.json").read_text())  # type: ignore[no-any-return]


def _cases(mutate: Any, wanted: Any) -> list[Any]:
    if not SMI:
        return no_captures("*.txt", arity=2)
    out = []
    for path in SMI:
        cap = Capture(path)
        if wanted(cap):
            out.append(pytest.param(*mutate(cap), id=path.stem))
    return out


def _refused(tmp_path: Path, text: str, *phrases: str) -> None:
    path = tmp_path / "damaged.txt"
    path.write_text(text)
    result = _isle("parse", str(path), "--format", "json")
    assert result.returncode == 2, result.stdout[:200]
    assert result.stdout == "" and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for phrase in phrases:
        assert phrase in lines[0], lines[0]


def _parsed(tmp_path: Path, text: str) -> dict[str, Any]:
    path = tmp_path / "variant.txt"
    path.write_text(text)
    result = _isle("parse", str(path), "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


# -- NIC rows ------------------------------------------------------------------------------------

def _drop_last_nic(cap: Capture) -> tuple[str, str]:
    last = cap.nic_rows[-1]
    return cap.with_line(cap.row_at(last), None), last


def _cut_nic_mid_cell(cap: Capture) -> tuple[str, str]:
    label = cap.nic_rows[-1]
    at = cap.row_at(label)
    start, _ = cap.span(at, len([d for d in cap.devices if d.startswith("GPU")]))  # its last GPU column
    return cap.with_line(at, cap.lines[at][: start + 2]), label


def _unknown_code(cap: Capture) -> tuple[str, str]:
    label = cap.nic_rows[0]
    at = cap.row_at(label)
    start, end = cap.span(at, 1)
    line = cap.lines[at]
    return cap.with_line(at, line[:start] + "QQ".ljust(end - start) + line[end:]), label


def _mirror_differs(cap: Capture) -> tuple[str, str]:
    label = cap.nic_rows[-1]
    at = cap.row_at(label)
    start, end = cap.span(at, 1)
    line = cap.lines[at]
    other = "PHB" if line[start:end] != "PHB" else "SYS"
    return cap.with_line(at, line[:start] + other + line[end:]), f"GPU0-{label}"


def _has_nics(cap: Capture) -> bool:
    return bool(cap.nic_rows)


@pytest.mark.parametrize(("text", "label"), _cases(_drop_last_nic, _has_nics))
def test_missing_last_nic_row_is_refused(tmp_path: Path, text: str, label: str) -> None:
    _refused(tmp_path, text, "truncated", f"row {label} is missing")


@pytest.mark.parametrize(("text", "label"), _cases(_cut_nic_mid_cell, _has_nics))
def test_nic_row_cut_mid_cell_is_refused(tmp_path: Path, text: str, label: str) -> None:
    _refused(tmp_path, text, "truncated", f"row {label}", "mid-cell")


@pytest.mark.parametrize(("text", "label"), _cases(_unknown_code, _has_nics))
def test_unknown_code_in_nic_row_is_refused(tmp_path: Path, text: str, label: str) -> None:
    _refused(tmp_path, text, f"unknown cell code 'QQ' in row {label}, column GPU0")


@pytest.mark.parametrize(("text", "pair"), _cases(_mirror_differs, _has_nics))
def test_nic_row_disagreeing_with_its_mirror_is_refused(tmp_path: Path, text: str, pair: str) -> None:
    _refused(tmp_path, text, "not symmetric", pair, "mirror")


# -- GPU rows ------------------------------------------------------------------------------------

def _gpu_row(cap: Capture) -> tuple[int, str]:
    label = f"GPU{len([d for d in cap.devices if d.startswith('GPU')]) // 2}"
    return cap.row_at(label), label


def _cut_after_cells(cap: Capture) -> tuple[str, str]:
    at, label = _gpu_row(cap)
    _, end = cap.span(at, len(cap.devices))
    return cap.with_line(at, cap.lines[at][:end]), label


def _cut_last_value(cap: Capture) -> tuple[str, str]:
    at, label = _gpu_row(cap)
    start, _ = cap.span(at, len(cap.devices) + len(cap.trailers) - 1)
    return cap.with_line(at, cap.lines[at][:start].rstrip()), label


@pytest.mark.parametrize(("text", "label"), _cases(_cut_after_cells, lambda c: bool(c.trailers)))
def test_gpu_row_cut_after_its_cells_is_refused(tmp_path: Path, text: str, label: str) -> None:
    _refused(tmp_path, text, "truncated", f"row {label}")


@pytest.mark.parametrize(("text", "label"), _cases(_cut_last_value, lambda c: len(c.trailers) >= 2))
def test_gpu_row_cut_before_its_last_value_is_refused(tmp_path: Path, text: str, label: str) -> None:
    _refused(tmp_path, text, "truncated", f"row {label}")


def _blank_cpu(cap: Capture, keep_width: bool, rows: str) -> tuple[str, dict[str, Any]]:
    labels = [d for d in cap.devices if d.startswith("GPU")]
    chosen = labels if rows == "all" else [_gpu_row(cap)[1]]
    expected, lines = cap.expected(), list(cap.lines)
    for label in chosen:
        at = cap.row_at(label)
        start, end = cap.span(at, len(cap.devices) + 1)
        lines[at] = lines[at][:start] + (" " * (end - start) if keep_width else "") + lines[at][end:]
        expected["gpus"][int(label[3:])]["cpu_affinity"] = None
    return "\n".join(lines) + "\n", expected


def _with_cpu_and_numa(cap: Capture) -> bool:
    return cap.trailers[:2] == ["CPU Affinity", "NUMA Affinity"]


BLANKS = [
    *(_cases(lambda c: _blank_cpu(c, keep_width=True, rows="one"), _with_cpu_and_numa)),
    *(_cases(lambda c: _blank_cpu(c, keep_width=False, rows="all"), _with_cpu_and_numa)),
]


@pytest.mark.parametrize(("text", "expected"), BLANKS)
def test_blank_cpu_affinity_keeps_numa(tmp_path: Path, text: str, expected: dict[str, Any]) -> None:
    assert _parsed(tmp_path, text) == expected


# -- headers whose separators were lost ----------------------------------------------------------

def _glued(cap: Capture) -> tuple[str, dict[str, Any]]:
    """Tabs lost: the column names run together, the spaces inside `CPU Affinity` stay."""
    fields = re.split(r"\t|\s{2,}", cap.lines[cap.header_at].strip())
    return cap.with_line(cap.header_at, "".join(fields)), cap.expected()


def _glued_labels(cap: Capture) -> tuple[str, dict[str, Any]]:
    """Only the device labels run together (the DGX-1 capture: `GPU0GPU1...mlx5_0`)."""
    line = "".join(cap.devices) + "".join(f"\t{t}" for t in cap.trailers)
    return cap.with_line(cap.header_at, line), cap.expected()


@pytest.mark.parametrize(("text", "expected"), [*_cases(_glued, bool), *_cases(_glued_labels, bool)])
def test_header_without_separators_is_split_by_the_row_labels(
        tmp_path: Path, text: str, expected: dict[str, Any]) -> None:
    assert _parsed(tmp_path, text) == expected


def _glued_without_last_row(cap: Capture) -> tuple[str, str]:
    text, _ = _glued_labels(cap)
    last = list(cap.rows)[-1]
    lines = text.splitlines()
    del lines[last]
    return "\n".join(lines) + "\n", cap.rows[last]


@pytest.mark.parametrize(("text", "label"), _cases(_glued_without_last_row, lambda c: len(c.devices) > 1))
def test_glued_header_that_does_not_split_into_the_rows_is_refused(tmp_path: Path, text: str, label: str) -> None:
    _refused(tmp_path, text, "truncated", repr(label), "run together")
