"""Communication benchmarks: what is probed on real machines' templates, records (JSON, applied to
the cost model's links, compared with a baseline), and `python -m topology bench` for real with
torch's gloo backend on loopback (four ranks standing in for the pairs machine's four GPUs)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest

from physics.costmodel import LinkCost
from tests.conftest import ROOT
from tests.topology.conftest import run_cli
from topology import GpuRef, bottleneck, path, read_source
from topology.bench.plan import Probe, plan_probes
from topology.bench.record import BenchRecord, Measurement, apply, is_record, load, regressions, save
from topology.errors import TopologyError

PAIRS = str(ROOT / "tests/data/pairs-4gpu.txt")


def _probes(source: str) -> list[tuple[str, tuple[int, ...], str, str]]:
    t = read_source(source)
    probes = plan_probes(t, t.nodes[0].name)
    copies = [p for p in probes if p.kind in ("h2d", "d2h")]
    assert [(p.kind, p.gpus, p.link, p.tier) for p in copies] == [
        (kind, (g.index,), "host", "pcie") for g in t.nodes[0].gpus for kind in ("h2d", "d2h")]
    return [(p.kind, p.gpus, p.link, p.tier) for p in probes if p not in copies]


@pytest.mark.unit
@pytest.mark.parametrize(("source", "expected"), [
    (PAIRS, [("p2p", (0, 1), "nvlink x4", "nvlink"), ("p2p", (0, 2), "sys", "numa"),
             ("allreduce", (0, 1), "nvlink", "nvlink"), ("allreduce", (2, 3), "nvlink", "nvlink")]),
    # DGX-1 hybrid cube mesh: single and double NVLink pairs are two tiers; one island of 8
    ("dgx1-v100", [("p2p", (0, 1), "nvlink x1", "nvlink"), ("p2p", (0, 3), "nvlink x2", "nvlink"),
                   ("p2p", (0, 5), "sys", "numa"), ("allreduce", tuple(range(8)), "nvlink", "nvlink")]),
    ("hgx-h100", [("p2p", (0, 1), "nvlink x18", "nvlink"), ("allreduce", tuple(range(8)), "nvlink", "nvlink")]),
    ("rtx4090-pcie", [("p2p", (0, 1), "node", "pcie"), ("p2p", (0, 4), "sys", "numa")]),  # no island
])
def test_copies_per_gpu_one_p2p_probe_per_link_tier_and_one_allreduce_per_island(
        source: str, expected: list[tuple[str, tuple[int, ...], str, str]]) -> None:
    assert _probes(source) == expected


def _record(bandwidths: dict[str, float], source: str = PAIRS) -> BenchRecord:
    t = read_source(source)
    node = t.nodes[0].name
    return BenchRecord(fingerprint=t.fingerprint(), source=source, node=node, backend="nccl", device="cuda",
                       started_at="2026-01-01T00:00:00+00:00", measurements=tuple(
                           Measurement(probe=p, size_bytes=1 << 28, bandwidth_gb_s=bandwidths[p.link], latency_us=4.0,
                                       iters=20) for p in plan_probes(t, node) if p.link in bandwidths))


@pytest.mark.unit
def test_records_round_trip_and_are_told_apart_from_topologies(tmp_path: Path) -> None:
    record = _record({"nvlink x4": 61.5, "sys": 9.75, "nvlink": 40.0})
    save(record, str(tmp_path / "r.json"))
    assert load(str(tmp_path / "r.json")) == record and is_record(str(tmp_path / "r.json"))
    assert not is_record(PAIRS) and not is_record(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text(json.dumps({"kind": "something else"}))
    with pytest.raises(TopologyError, match="not a bench record"):
        load(str(tmp_path / "bad.json"))


@pytest.mark.unit
def test_measured_values_replace_the_defaults_the_cost_model_reads() -> None:
    t = read_source(PAIRS)
    default = path(t, GpuRef("node0", 2), GpuRef("node0", 3)).bandwidth_gb_s
    measured = apply(t, _record({"nvlink x4": 61.5, "sys": 9.75}))
    assert measured.fingerprint() == t.fingerprint()
    # the pair measured and the other pair of the same tier take the measured value
    for pair in ((0, 1), (2, 3)):
        p = path(measured, GpuRef("node0", pair[0]), GpuRef("node0", pair[1]))
        assert p.bandwidth_gb_s == 61.5 != default and p.latency_us == 4.0
    assert path(measured, GpuRef("node0", 1), GpuRef("node0", 3)).bandwidth_gb_s == 9.75
    tp_link = LinkCost.of(bottleneck(measured, [GpuRef("node0", 0), GpuRef("node0", 1)]))
    assert tp_link.bandwidth_gb_s == 61.5
    with pytest.raises(TopologyError, match="does not match this topology"):
        apply(read_source("hgx-h100"), _record({"sys": 1.0}))


@pytest.mark.unit
def test_regressions_against_a_baseline() -> None:
    base = _record({"nvlink x4": 60.0, "sys": 10.0, "nvlink": 40.0})
    now = _record({"nvlink x4": 45.0, "sys": 10.5, "nvlink": 50.0})
    changes = {(c.subject, c.worse): c.what for c in regressions(base, now)}
    assert changes.pop(("p2p GPU0-GPU1 (nvlink x4)", True)) == "measured 60 -> 45 GB/s (-25%)"
    assert all(not worse for _, worse in changes)  # the all-reduces got faster: said, not worse
    gone = regressions(base, dataclasses.replace(now, measurements=now.measurements[1:]))
    assert any(c.worse and c.what == "no longer measured" for c in gone)


needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="torch is not installed (the bench extra: torch==2.13.0)")


@pytest.mark.integration
@needs_torch
def test_bench_runs_on_gloo_and_diff_reports_a_drop(tmp_path: Path) -> None:
    out = tmp_path / "base.json"
    done = run_cli("bench", PAIRS, "--backend", "gloo", "--size-mib", "0.25", "--iters", "2", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "p2p node0:GPU0-GPU1" in done.stdout and "gloo on loopback" in done.stdout
    record = load(str(out))
    assert record.backend == "gloo" and record.fingerprint == read_source(PAIRS).fingerprint()
    assert [m.probe for m in record.measurements] == plan_probes(read_source(PAIRS), "node0")
    assert all(m.bandwidth_gb_s > 0 and m.latency_us > 0 for m in record.measurements)
    slower = dataclasses.replace(record, measurements=tuple(
        dataclasses.replace(m, bandwidth_gb_s=m.bandwidth_gb_s / 2) for m in record.measurements))
    save(slower, str(tmp_path / "slower.json"))
    diff = run_cli("diff", str(out), str(tmp_path / "slower.json"))
    assert diff.returncode == 1 and "(-50%)" in diff.stdout, diff.stdout + diff.stderr
    assert run_cli("diff", str(out), str(out)).returncode == 0


@pytest.mark.unit
def test_probe_names() -> None:
    assert Probe(kind="p2p", node="n", gpus=(0, 3), link="sys", tier="numa").name == "p2p n:GPU0-GPU3"
