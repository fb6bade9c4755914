"""Every shipped capture and cluster spec drawn: no label overlaps another and no line crosses a
label (the rule and how it is measured: tests/support/labels.py). NCCL files are drawn with
their GPUs, AWS's static g5 file included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import NCCL_DIR, ROOT, TOPO_DIR, no_captures
from tests.support.labels import Label, crossed, labels, line_paths, overlapping
from topology.draw import figure
from topology.readers import ReadOptions, read_source

pytestmark = pytest.mark.unit

SHIPPED = sorted(TOPO_DIR.glob("*.txt")) + sorted(NCCL_DIR.glob("*.xml")) if TOPO_DIR.is_dir() else []
CLUSTERS = sorted((ROOT / "configs/clusters").glob("*.yaml"))


def _check(fig: Any) -> tuple[list[tuple[str, str]], list[str]]:
    import matplotlib.pyplot as plt

    try:
        boxes = labels(fig)
        return overlapping(boxes), crossed(boxes, line_paths(fig))
    finally:
        plt.close(fig)


@pytest.mark.parametrize("source", [pytest.param(p, id=p.name) for p in SHIPPED + CLUSTERS]
                         or no_captures("*.txt"))
def test_no_label_overlaps_or_is_crossed(source: Path) -> None:
    topology = read_source(str(source), ReadOptions())
    overlaps, crossings = _check(figure(topology, title=source.name))
    assert overlaps == [] and crossings == []


def test_a_plan_overlay_keeps_the_rule() -> None:
    topology = read_source(str(ROOT / "configs/clusters/local-sim.yaml"), ReadOptions())
    plan = {"placements": [
        {"replica_id": "decode-0", "node": "h100-0", "role": "decode", "gpus": [0, 1, 2, 3]},
        {"replica_id": "prefill-0", "node": "h100-1", "role": "prefill", "gpus": [0, 1]},
        {"replica_id": "gang-0", "role": "mixed", "in_domain": False, "members": [
            {"node": "h100-1", "gpus": [4, 5, 6, 7]}, {"node": "h100-degraded", "gpus": [4, 5, 6, 7]}]}]}
    fig = figure(topology, plan, title="plan")
    texts = {t.get_text() for t in fig.axes[0].texts}
    assert {"decode-0 · GPU0–3", "gang-0 (2 ranks, spans domains) · GPU4–7", "gang-0 · GPU4–7"} <= texts
    assert _check(fig) == ([], [])


def test_nccl_files_are_drawn_with_their_gpus() -> None:
    for source in sorted(NCCL_DIR.glob("*.xml")) or pytest.skip(f"{NCCL_DIR} is absent"):
        fig = figure(read_source(str(source), ReadOptions()), title=source.name)
        gpus = [t.get_text() for t in fig.axes[0].texts if t.get_text().startswith("GPU")]
        _check(fig)
        assert len(gpus) == 8, source.name


def test_the_rule_catches_what_it_forbids() -> None:
    """Two labels on top of each other and a line through a third are found."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(3, 2))
    ax.text(0.1, 0.5, "first label")
    ax.text(0.15, 0.5, "second label")
    ax.text(0.5, 0.1, "crossed")
    ax.plot([0.55, 0.55], [0.0, 0.3])
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    overlaps, crossings = _check(fig)
    assert overlaps == [("first label", "second label")] and crossings == ["crossed"]
    assert not Label("a", 0, 0, 1, 1).overlaps(Label("b", 1, 0, 2, 1))  # touching is not overlapping


def test_kv_paths_are_drawn_by_verdict_between_their_replicas() -> None:
    """`isle status --draw`: each prefill->decode pair a curve coloured by the router's verdict,
    dashed while avoided; a pair naming a replica the plan lacks is not drawn."""
    from matplotlib.patches import FancyArrowPatch

    from topology.draw import VERDICT_COLOURS

    topology = read_source(str(ROOT / "configs/clusters/local-sim.yaml"), ReadOptions())
    plan = {"placements": [
        {"replica_id": "prefill-0", "node": "h100-0", "role": "prefill", "gpus": [0, 1]},
        {"replica_id": "decode-0", "node": "h100-0", "role": "decode", "gpus": [2, 3]},
        {"replica_id": "decode-1", "node": "h100-1", "role": "decode", "gpus": [0, 1]}],
        "kv_paths": [{"prefill": "prefill-0", "decode": "decode-0", "verdict": "as_planned", "avoided": False},
                     {"prefill": "prefill-0", "decode": "decode-1", "verdict": "wrong_path", "avoided": True},
                     {"prefill": "prefill-0", "decode": "gone-7", "verdict": "slow", "avoided": False}]}
    fig = figure(topology, plan, title="kv paths")
    try:
        arrows = [p for p in fig.axes[0].patches if isinstance(p, FancyArrowPatch)]
        drawn = sorted((p.get_edgecolor(), p.get_linestyle()) for p in arrows)
        import matplotlib.colors as mc

        assert drawn == sorted([(mc.to_rgba(VERDICT_COLOURS["as_planned"], 0.85), "-"),
                                (mc.to_rgba(VERDICT_COLOURS["wrong_path"], 0.85), "--")])
        legend = {t.get_text() for t in fig.axes[0].get_legend().get_texts()}
        assert {"KV path as_planned", "KV path wrong_path", "KV path slow", "KV path avoided"} <= legend
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
