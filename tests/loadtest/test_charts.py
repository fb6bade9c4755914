"""The load-test charts read apart: a distinct marker and line style per series, a line drawn
first is wider than the ones over it (so one policy's line never hides another's), legends
outside the plotting area, and no two labels (titles, tick labels, legend entries) overlap
(measured from the renderer's text boxes: tests/support/labels.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from loadtest import scaling_report
from loadtest.report import attainment_figure, goodput_figure, latency_figure
from tests.support.labels import labels, overlapping

pytestmark = pytest.mark.unit

POLICIES = ["island-aligned", "ray-pack", "first-fit", "random", "island-aligned+autoscale:topology"]
TIERS = ["local", "nvlink", "pcie", "numa"]


def _rows() -> list[dict[str, Any]]:
    rows = []
    for k, policy in enumerate(POLICIES):
        for scale in (1, 2, 4, 8):
            same = 1 if policy == "first-fit" else k  # first-fit places as ray-pack (k = 1) does: identical lines
            per_tier = {t: {"ttft_ms": {"median": 40.0 * (j + 1), "p99": 300.0 * (j + 1) + same},
                            "tpot_ms": {"median": 8.0 + j, "p99": 30.0 + 5 * j}} for j, t in enumerate(TIERS)}
            rows.append({"policy": policy, "rate_scale": scale, "rate_rps": 5.0 * scale,
                         "goodput_rps": 5.0 * scale / (1 + 0.1 * same * scale),
                         "summary": {"per_tier": per_tier},
                         "slo_attainment": {"interactive": 0.9 - 0.1 * same, "standard": 0.95, "batch": 1.0}})
    return rows


def _auto() -> list[dict[str, Any]]:
    out = []
    for name, steps in (("static", [(0, 9)]), ("blind", [(0, 4), (100, 5), (240, 9), (480, 8)]),
                        ("topology", [(0, 4), (240, 9), (480, 6), (540, 5)])):
        timeline = [{"t": float(t), "pool": "chat", "serving": next(n for s, n in reversed(steps) if s <= t)}
                    for t in range(0, 600, 5)]
        out.append({"autoscaler": name, "timeline": timeline, "peak_s": [200.0, 400.0], "gpu_hours": 2.5,
                    "attainment": {"interactive": 0.8, "standard": 0.9},
                    "attainment_peak": {"interactive": 0.7, "standard": 0.85}})
    return out


def _close(fig: Any) -> None:
    import matplotlib.pyplot as plt

    plt.close(fig)


@pytest.mark.parametrize("build", [goodput_figure, latency_figure, attainment_figure],
                         ids=["goodput", "latency", "attainment"])
def test_no_label_overlaps_and_the_legend_covers_no_data(build: Callable[[Any], Any]) -> None:
    fig = build(_rows())
    try:
        assert overlapping(labels(fig)) == []
        renderer = fig.canvas.get_renderer()
        for ax in fig.axes:
            legend = ax.get_legend()
            if legend is not None:
                assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))
    finally:
        _close(fig)


def test_each_policy_has_its_own_marker_and_style_and_none_hides_another() -> None:
    fig = goodput_figure(_rows())
    try:
        lines = fig.axes[0].get_lines()
        assert [line.get_label() for line in lines] == POLICIES
        assert len({(line.get_marker(), str(line.get_linestyle())) for line in lines}) == len(POLICIES)
        assert len({line.get_color() for line in lines}) == len(POLICIES)
        widths = [line.get_linewidth() for line in lines]
        sizes = [line.get_markersize() for line in lines]
        assert widths == sorted(widths, reverse=True) and len(set(widths)) == len(widths)
        assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == len(sizes)
        assert all(line.get_markerfacecolor() == "none" for line in lines)  # hollow: what is under shows
    finally:
        _close(fig)


@pytest.mark.parametrize("build", [scaling_report.replicas_figure, scaling_report.summary_figure],
                         ids=["replicas", "summary"])
def test_autoscaling_charts_read_apart(build: Callable[[Any], Any]) -> None:
    fig = build(_auto())
    try:
        assert overlapping(labels(fig)) == []
        lines = [line for line in fig.axes[0].get_lines() if not line.get_label().startswith("_")]
        if build is scaling_report.replicas_figure:
            assert len({(line.get_marker(), str(line.get_linestyle())) for line in lines}) == 3
            widths = [line.get_linewidth() for line in lines]
            assert widths == sorted(widths, reverse=True)
    finally:
        _close(fig)
