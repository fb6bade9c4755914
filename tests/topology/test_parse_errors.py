"""Input the readers cannot use: exit code 2, one clear line on stderr, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import captures, no_captures
from tests.topology.conftest import run_cli
from topology.errors import ParseError
from topology.readers import read_node_text

pytestmark = pytest.mark.unit

CASES: list[tuple[str, bytes | None, str]] = [
    ("empty", b"", "empty input"),
    ("whitespace", b"   \n\t\n", "empty input"),
    ("binary", bytes(range(256)) * 4, "binary data"),
    ("latin1", "GPU0\tGPU1\n\xe9\xe9".encode("latin-1"), "not UTF-8"),
    ("not-a-topology", b"hello world\nthis is not nvidia-smi\n", "no `nvidia-smi topo -m` matrix"),
    ("xml-not-nccl", b"<html><body>hi</body></html>", "root element is <html>"),
    ("xml-broken", b"<system><cpu numaid='0'>", "malformed XML"),
    ("xml-entities", b"<!DOCTYPE x [<!ENTITY a 'b'>]><system/>", "DOCTYPE or ENTITY"),
    ("json-broken", b'{"gpus": [', "malformed JSON"),
    ("yaml-spec-bad", b"nodes:\n  - {name: a, template: no-such-machine}\n", "unknown template"),
]


@pytest.mark.parametrize(("name", "data", "message"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_exits_2_with_one_line(tmp_path: Path, name: str, data: bytes, message: str) -> None:
    path = tmp_path / f"{name}.txt"
    path.write_bytes(data or b"")
    result = run_cli("parse", str(path), "--format", "json")
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert message in lines[0]


def _mutations() -> list[Any]:
    found = captures("hgx-h100*.txt")
    if not found:
        return no_captures("hgx-h100*.txt", arity=2)
    text = found[0].read_text()
    rows = text.splitlines()
    return [pytest.param(name, damaged, id=name) for name, damaged in [
        ("truncated-rows", "\n".join(rows[:4])),
        ("truncated-cells", "\n".join([*rows[:3], rows[3][:30], *rows[4:]])),
        ("unknown-code", text.replace("NV18", "NV18", 5).replace("PXB", "QQQ", 1)),
        ("asymmetric", text.replace("GPU1    NV18", "GPU1    SYS ", 1)),
        ("bad-diagonal", text.replace(" X      NV18    NV18    NV18    NV18    NV18    NV18    NV18    PIX",
                                      " SYS    NV18    NV18    NV18    NV18    NV18    NV18    NV18    PIX", 1)),
    ]]


MUTATIONS = _mutations()


@pytest.mark.parametrize(("name", "text"), MUTATIONS)
def test_damaged_capture_is_a_parse_error(tmp_path: Path, name: str, text: str) -> None:
    with pytest.raises(ParseError):
        read_node_text(text)
    path = tmp_path / "damaged.txt"
    path.write_text(text)
    result = run_cli("parse", str(path))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_unknown_code_names_row_and_column() -> None:
    text = "\tGPU0\tGPU1\nGPU0\t X \tNVX\nGPU1\tNVX\t X \n"
    with pytest.raises(ParseError, match=r"unknown cell code 'NVX' in row GPU0, column GPU1"):
        read_node_text(text)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    for source, message in ((str(tmp_path / "nope.txt"), "no such file"), (str(tmp_path), "is a directory")):
        result = run_cli("parse", source)
        assert result.returncode == 2
        assert message in result.stderr and "Traceback" not in result.stderr


def test_discover_without_driver_is_one_clear_line() -> None:
    result = run_cli("discover", "--format", "json")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "NVML" in result.stderr and "Traceback" not in result.stderr


def test_deep_nccl_xml_and_badly_typed_json_are_parse_errors(tmp_path: Path) -> None:
    deep = "<system><cpu numaid='0'>" + "<pci busid='0000:00:01.0'>" * 3000 + "</pci>" * 3000 + "</cpu></system>"
    (tmp_path / "deep.xml").write_text(deep)
    doc = {"source_format": "x", "gpus": [{"index": "x"}, {"index": 0}], "links": [], "nics": []}
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    doc2 = {"gpus": [{"index": 0}], "links": [], "nics": [{"name": "n", "nearest_gpus": [5], "level": "pix"}]}
    (tmp_path / "nic.json").write_text(json.dumps(doc2))
    for name in ("deep.xml", "bad.json", "nic.json"):
        result = run_cli("parse", str(tmp_path / name), "--format", "json")
        assert result.returncode == 2 and "Traceback" not in result.stderr, (name, result.stderr)
