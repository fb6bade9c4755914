"""Every real capture parses to exactly its .expected.json, through the same code path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import capture_params, captures, no_captures, shared_path
from tests.topology.conftest import run_cli
from topology.export import dumps, node_capture
from topology.readers import read_node_text

pytestmark = pytest.mark.unit

CAPTURES = captures()


def test_fixtures_are_present() -> None:
    # A checkout without shared/data would silently run no capture test below.
    shared_path("topo")
    assert len(CAPTURES) >= 10


@pytest.mark.parametrize("capture", capture_params())
def test_capture_matches_expected(capture: Path) -> None:
    expected_path = capture.with_suffix(".expected.json")
    node = read_node_text(capture.read_text())
    produced = dumps(node_capture(node))
    assert json.loads(produced) == json.loads(expected_path.read_text())
    assert produced == expected_path.read_text(), "layout differs from the reference file"


@pytest.mark.parametrize("capture", capture_params()[:3])
def test_cli_parse_prints_the_schema(capture: Path) -> None:
    result = run_cli("parse", str(capture), "--format", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == json.loads(capture.with_suffix(".expected.json").read_text())


def _expected(name: str) -> dict[str, object]:
    path = next(c for c in CAPTURES if c.stem.startswith(name)).with_suffix(".expected.json")
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def _variant_cases() -> list[Any]:
    """Other captures of the same tool: the real ones rewritten the ways other drivers print."""
    ansi = "\x1b[4m"
    cases: list[Any] = []
    if not CAPTURES:
        return no_captures("*.txt", arity=3)
    h100 = next(c for c in CAPTURES if c.stem.startswith("hgx-h100")).read_text()
    rtx = next(c for c in CAPTURES if c.stem.startswith("rtx4090")).read_text()
    dgx1 = next(c for c in CAPTURES if c.stem.startswith("dgx1")).read_text()
    lines = h100.splitlines()
    cases.append(("hgx-h100", "tabs", "\n".join("\t".join(ln.split("    ")) for ln in lines)))
    cases.append(("hgx-h100", "ansi-header", ansi + lines[0] + "\x1b[0m\n" + "\n".join(lines[1:])))
    cases.append(("hgx-h100", "crlf", h100.replace("\n", "\r\n")))
    cases.append(("hgx-h100", "prompt-and-trailer", "$ nvidia-smi topo -m\n" + h100 + "\n$ exit\n"))
    cases.append(("rtx4090", "old-soc-legend", rtx.replace("SYS ", "SOC ").replace("SYS\t", "SOC\t")))
    cases.append(("dgx1", "no-legend", dgx1.split("Legend:")[0]))
    return cases


@pytest.mark.parametrize(("name", "variant", "text"), _variant_cases(), ids=lambda x: x if len(x) < 30 else "")
def test_variants_of_real_captures_parse_the_same(name: str, variant: str, text: str) -> None:
    got = node_capture(read_node_text(text))
    assert got == _expected(name), variant


def test_numa_affinity_list_and_na() -> None:
    text = (
        "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
        "GPU0\t X \tNV18\t0-71\t0,3-9,11-17\t2\n"
        "GPU1\tNV18\t X \t72-143\tN/A\t10\n"
    )
    got = node_capture(read_node_text(text))
    assert [g["numa_node"] for g in got["gpus"]] == [0, None]
    assert got["islands"] == [[0, 1]]


def test_an_infinity_fabric_link_runs_at_its_generations_rate() -> None:
    """The MI300X rocm-smi capture read as what it would print on MI355X: the same eight-GPU
    mesh, each link at CDNA 4's 76.8 GB/s a direction (153.6 bidirectional), not MI300X's 64."""
    capture = str(shared_path("topo") / "amd-mi300-8gpu-xgmi-rocm-smi.txt")
    rates = {}
    for gpu in ("mi300x", "mi355x"):
        result = run_cli("parse", capture, "--gpu", gpu, "--format", "model")
        assert result.returncode == 0, result.stderr
        links = json.loads(result.stdout)["nodes"][0]["links"]
        assert len(links) == 28 and {k["kind"] for k in links} == {"xgmi"}
        rates[gpu] = {k["bandwidth_gb_s"] for k in links}
    assert rates == {"mi300x": {64.0}, "mi355x": {76.8}}


def test_a_part_named_as_rocm_smi_and_people_write_it_is_the_catalogues() -> None:
    """`--gpu "AMD Instinct MI355X"` (the product name) reads the capture as `--gpu mi355x` does;
    a part the catalogue does not list is refused with the known ones, not guessed."""
    capture = str(shared_path("topo") / "amd-mi300-8gpu-xgmi-rocm-smi.txt")
    read = [run_cli("parse", capture, "--gpu", gpu, "--format", "model") for gpu in ("mi355x", "AMD Instinct MI355X")]
    assert all(r.returncode == 0 for r in read), [r.stderr for r in read]
    assert json.loads(read[0].stdout) == json.loads(read[1].stdout)
    refused = run_cli("parse", capture, "--gpu", "MI300X 256GB", "--format", "model")
    assert refused.returncode != 0 and "mi300x has 192 GB" in refused.stderr and "known:" in refused.stderr
