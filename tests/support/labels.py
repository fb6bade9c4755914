"""Is a matplotlib picture readable? Every label's box as the renderer places it (window
extents, pixels), which boxes overlap, and which lines cross a box.

The rule the drawing and chart tests hold pictures to:
- two labels overlap when their boxes share more than a sliver: each box is shrunk by
  `TOLERANCE_PX` on every side first (anti-aliasing and the renderer's rounding put touching
  boxes a pixel into each other);
- a line crosses a label when a segment of it (curves flattened into segments) enters the
  label's box, shrunk the same way. Lines are the axes' Line2D and the arrows of annotations
  (how the topology drawing draws links); patches (panels, bands, boxes) are backgrounds and
  may lie under a label.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

TOLERANCE_PX = 0.5


@dataclass(frozen=True, slots=True)
class Label:
    text: str
    x0: float
    y0: float
    x1: float
    y1: float

    def overlaps(self, other: Label) -> bool:
        return self.x0 < other.x1 and other.x0 < self.x1 and self.y0 < other.y1 and other.y0 < self.y1


def _drawn_tick_labels(axis: Any) -> Iterable[Any]:
    """The tick labels matplotlib draws: those of ticks inside the view (it keeps others)."""
    lo, hi = sorted(axis.get_view_interval())
    eps = (hi - lo) * 1e-9
    for tick in axis.get_major_ticks() + axis.get_minor_ticks():
        if lo - eps <= tick.get_loc() <= hi + eps:
            yield from (label for label in (tick.label1, tick.label2) if label.get_visible())


def _texts(fig: Any) -> Iterable[Any]:
    for ax in fig.axes:
        yield from ax.texts
        yield ax.title
        yield ax._left_title
        yield ax._right_title
        yield ax.xaxis.label
        yield ax.yaxis.label
        for axis in (ax.xaxis, ax.yaxis):
            yield from _drawn_tick_labels(axis)
        legend = ax.get_legend()
        if legend is not None:
            yield from legend.get_texts()
            yield legend.get_title()
    yield from fig.texts


def labels(fig: Any) -> list[Label]:
    """The visible, non-empty labels of a drawn figure (draws it first)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    out = []
    for text in _texts(fig):
        if not text.get_visible() or not text.get_text().strip():
            continue
        box = text.get_window_extent(renderer)
        out.append(Label(text.get_text(), box.x0 + TOLERANCE_PX, box.y0 + TOLERANCE_PX,
                         box.x1 - TOLERANCE_PX, box.y1 - TOLERANCE_PX))
    return out


def overlapping(boxes: Sequence[Label]) -> list[tuple[str, str]]:
    """Every pair of labels whose boxes overlap."""
    ordered = sorted(boxes, key=lambda b: b.x0)
    out = []
    for i, a in enumerate(ordered):
        for b in ordered[i + 1:]:
            if b.x0 >= a.x1:
                break
            if a.overlaps(b):
                out.append((a.text, b.text))
    return out


def line_paths(fig: Any) -> list[Any]:
    """Each line in display coordinates as an (n, 2) array of points (curves flattened)."""
    import numpy as np

    paths = []
    for ax in fig.axes:
        for line in ax.lines:
            paths.append(line.get_transform().transform_path(line.get_path()))
        for text in ax.texts:
            arrow = getattr(text, "arrow_patch", None)
            if arrow is not None:
                paths.append(arrow.get_transform().transform_path(arrow.get_path()))
    out = []
    for path in paths:
        for poly in path.to_polygons(closed_only=False):
            pts = np.asarray(poly, dtype=float)
            if len(pts) > 1:
                out.append(pts[np.isfinite(pts).all(axis=1)])
    return out


def _segment_enters(p: Any, q: Any, box: Label) -> bool:
    """Liang-Barsky: does the segment p-q meet the box?"""
    t0, t1 = 0.0, 1.0
    dx, dy = q[0] - p[0], q[1] - p[1]
    for edge_p, edge_q in ((-dx, p[0] - box.x0), (dx, box.x1 - p[0]), (-dy, p[1] - box.y0), (dy, box.y1 - p[1])):
        if edge_p == 0:
            if edge_q < 0:
                return False
            continue
        t = edge_q / edge_p
        if edge_p < 0:
            t0 = max(t0, t)
        else:
            t1 = min(t1, t)
        if t0 > t1:
            return False
    return True


def crossed(boxes: Sequence[Label], lines: Sequence[Any]) -> list[str]:
    """The labels a line crosses."""
    out = []
    for box in boxes:
        for pts in lines:
            lo, hi = pts.min(axis=0), pts.max(axis=0)
            if hi[0] < box.x0 or lo[0] > box.x1 or hi[1] < box.y0 or lo[1] > box.y1:
                continue
            if any(_segment_enters(pts[k], pts[k + 1], box) for k in range(len(pts) - 1)):
                out.append(box.text)
                break
    return out
