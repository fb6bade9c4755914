"""How the load-test charts tell their series apart, so that none hides another.

Each series (a placement policy, an autoscaler) gets its own colour, marker and line style, in
the order the series are drawn. Where two series coincide (ray-pack and first-fit often place
identically), the one drawn first is the widest line with the largest hollow marker, and each
later one is narrower and smaller on top of it: both stay visible, the earlier as an outline.
Legends sit outside the plotting area, so they cover no data.
"""

from __future__ import annotations

from typing import Any

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">", "p")
LINESTYLES: tuple[Any, ...] = ("-", "--", "-.", ":", (0, (5, 1, 1, 1)), (0, (1, 1)), (0, (6, 2)),
                               (0, (3, 1, 1, 1, 1, 1)))
WIDEST_LW = 3.4
NARROWEST_LW = 1.2
LARGEST_MARKER = 11.0
SMALLEST_MARKER = 4.5


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (charts are files; no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def series_style(k: int, n: int) -> dict[str, Any]:
    """Line and marker settings for the k-th of n series (k = 0 is drawn first, at the bottom)."""
    step = 1.0 if n <= 1 else k / (n - 1)
    return {
        "color": f"C{k % 10}",
        "marker": MARKERS[k % len(MARKERS)],
        "linestyle": LINESTYLES[k % len(LINESTYLES)],
        "linewidth": WIDEST_LW - (WIDEST_LW - NARROWEST_LW) * step if n > 1 else 2.0,
        "markersize": LARGEST_MARKER - (LARGEST_MARKER - SMALLEST_MARKER) * step if n > 1 else 7.0,
        "markerfacecolor": "none",
        "markeredgewidth": 1.5,
        "zorder": 2 + k,
    }


def bar_style(k: int) -> dict[str, Any]:
    """A bar series: its colour and a hatch, so that bars read apart in grey too."""
    hatches = ("", "//", "..", "xx", "\\\\", "oo", "--", "++")
    return {"color": f"C{k % 10}", "hatch": hatches[k % len(hatches)], "edgecolor": "white", "linewidth": 0.0}


def legend_outside(ax: Any, **kwargs: Any) -> Any:
    """The legend to the right of the axes, top-aligned (save with bbox_inches='tight')."""
    return ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, frameon=False, **kwargs)
