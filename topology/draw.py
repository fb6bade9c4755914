"""Draw a topology as SVG or PNG: nodes as panels, NUMA domains as bands, GPUs grouped by island,
NVLink/XGMI coloured by kind (width by lanes), NVSwitch fabrics as a bar, PCIe switch pairs
dotted, unhealthy links and GPUs in red, NICs in lanes by their nearest GPUs with the PCIe level,
the reader's notes under each node's name, and optionally a placement plan's replicas outlined
by role, with each prefill->decode pair's KV path (the plan's `kv_paths`, as the router judges
them) a curve between the two replicas coloured by its verdict, dashed while avoided. Where each
thing goes is `topology.drawlayout`; no label overlaps another or is crossed by a line
(tests/topology/test_draw_labels.py measures it on every shipped capture).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from topology.drawlayout import (
    ARC_RAD,
    GPU_RADIUS,
    GPU_STEP,
    INCH_PER_UNIT,
    ISLAND_HALF,
    LINE_SPACING,
    NIC_H,
    NIC_W,
    UNIT_PER_PT,
    Layout,
    Panel,
    TextSpot,
    drawn,
    layout,
)
from topology.drawtext import plan_groups
from topology.errors import TopologyError
from topology.kinds import LinkKind
from topology.model import Topology

ISLAND_COLOURS = ["#cfe8ff", "#d8f5d0", "#ffe7c2", "#f3d5f7", "#fff3b0", "#d0f0ee", "#ffd6d6", "#e2e2f8"]
KIND_COLOURS = {LinkKind.NVSWITCH: "#1a7f37", LinkKind.NVLINK: "#1a7f37", LinkKind.XGMI: "#0e7c86",
                LinkKind.PIX: "#6e7781", LinkKind.PXB: "#8c959f", LinkKind.PHB: "#afb8c1",
                LinkKind.NODE: "#afb8c1", LinkKind.SYS: "#d0d7de"}
ROLE_COLOURS = {"prefill": "#d4a72c", "decode": "#0969da", "mixed": "#8250df"}
UNHEALTHY = "#cf222e"
VERDICT_COLOURS = {"as_planned": "#116329", "slow": "#bf8700", "wrong_path": "#a40e26", "failing": "#6639ba"}
"""A KV path's verdict (router.plugins.kvpath's vocabulary); another one is drawn grey."""


DPI = 160


def measure_text(text: str, size_pt: float, bold: bool = False) -> tuple[float, float]:
    """A label's width and height in points, as matplotlib lays out its lines."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    props = FontProperties(size=size_pt, weight="bold" if bold else "normal")
    widths = [TextToPath().get_text_width_height_descent(line, props, ismath=False)[0] * 1.04
              for line in text.split("\n")]
    return max(widths), size_pt * LINE_SPACING * len(widths)


def _text(ax: Any, spot: TextSpot, **style: Any) -> None:
    ax.text(spot.x, spot.y, spot.text, fontsize=spot.size_pt, ha=spot.ha, va=spot.va,
            linespacing=LINE_SPACING - 0.1, **style)


def _node_islands(layout_: Layout, p: Panel) -> list[str]:
    return [i.id for i in layout_.islands if p.node.name in i.nodes]


def _draw_panel(ax: Any, layout_: Layout, p: Panel, patches: Any) -> None:
    ax.add_patch(patches.FancyBboxPatch((p.x0, p.y0 - p.height), p.width, p.height, boxstyle="round,pad=0.05",
                                        fc="white", ec="#57606a", lw=1.2))
    _text(ax, p.title, weight="bold")
    mine = _node_islands(layout_, p)
    for spot, swatch in p.captions:
        kind, _, what = (swatch or "").partition(":")
        if kind == "island":
            colour = ISLAND_COLOURS[mine.index(what) % len(ISLAND_COLOURS)]
            ax.add_patch(patches.Rectangle((p.x0 + 0.2, spot.y - 0.07), 0.26, 0.14, fc=colour, ec="#8c959f", lw=0.6))
        elif kind == "role":
            ax.add_patch(patches.Rectangle((p.x0 + 0.2, spot.y - 0.07), 0.26, 0.14, fc="none",
                                           ec=ROLE_COLOURS.get(what, "#8250df"), lw=1.6))
        _text(ax, spot, color="#24292f" if swatch else "#9a6700")
    for band in p.bands:
        ax.add_patch(patches.Rectangle((p.x0 + 0.1, band.bottom), p.width - 0.2, band.top - band.bottom,
                                       fc="#f6f8fa", ec="none"))
        _text(ax, band.header, color="#57606a")
    for k, island in enumerate(i for i in layout_.islands if p.node.name in i.nodes):
        pts = [p.pos[g.index] for g in island.gpus if g.node == p.node.name]
        colour = ISLAND_COLOURS[k % len(ISLAND_COLOURS)]
        for row_y in sorted({q[1] for q in pts}, reverse=True):
            xs = [q[0] for q in pts if q[1] == row_y]
            ax.add_patch(patches.FancyBboxPatch((min(xs) - 0.5, row_y - ISLAND_HALF + 0.05),
                                                max(xs) - min(xs) + 1.0, 2 * ISLAND_HALF - 0.1,
                                                boxstyle="round,pad=0.05", fc=colour, ec="#8c959f", lw=0.8))


def _shrink_pt() -> float:
    return GPU_RADIUS / UNIT_PER_PT + 1.0


def _draw_links(ax: Any, p: Panel) -> None:
    node = p.node
    switch_gpus: dict[int, list[bool]] = {}
    for link in node.links:
        bad = not link.health.healthy
        if link.kind is LinkKind.NVSWITCH:
            switch_gpus.setdefault(link.a, []).append(bad)
            switch_gpus.setdefault(link.b, []).append(bad)
            continue
        if not drawn(link.kind, link.health.healthy):
            continue
        (xa, ya), (xb, yb) = sorted((p.pos[link.a], p.pos[link.b]))
        width = 0.6 + 0.5 * (link.lanes or 1) if link.kind.is_gpu_fabric else 0.6
        style = "--" if bad else (":" if not link.kind.is_gpu_fabric else "-")
        colour = UNHEALTHY if bad else KIND_COLOURS.get(link.kind, "#afb8c1")
        rad = ARC_RAD if abs(ya - yb) < 0.01 and abs(xa - xb) > GPU_STEP + 0.1 else 0.0
        ax.annotate("", xy=(xb, yb), xytext=(xa, ya), arrowprops={
            "arrowstyle": "-", "color": colour, "lw": width, "linestyle": style,
            "connectionstyle": f"arc3,rad={rad}", "shrinkA": _shrink_pt(), "shrinkB": _shrink_pt()})
    if switch_gpus and p.switch_bar:
        lanes = max((k.lanes or 0) for k in node.links if k.kind is LinkKind.NVSWITCH)
        _draw_switch(ax, p, switch_gpus, lanes)


def _draw_switch(ax: Any, p: Panel, switch_gpus: Mapping[int, list[bool]], lanes: int) -> None:
    """A bar between (or under) the rows with a stub to each GPU; more than two rows: a bar on
    the right, each GPU's stub an elbow under it."""
    assert p.switch_bar is not None
    green = KIND_COLOURS[LinkKind.NVSWITCH]
    row_ys = sorted({p.pos[g][1] for g in switch_gpus}, reverse=True)
    xs = [p.pos[g][0] for g in switch_gpus]
    vertical, at = p.switch_bar[0] == "v", p.switch_bar[1]
    if vertical:
        ax.plot([at, at], [row_ys[-1] - 0.62, row_ys[0]], color=green, lw=3)
        ax.text(at + 0.12, row_ys[0] - 0.2, f"NVSwitch\nNV{lanes}", fontsize=6, color=green, va="top")
    else:
        ax.plot([min(xs) - 0.3, max(xs) + 0.3], [at, at], color=green, lw=3)
        ax.text(max(xs) + 0.45, at, f"NVSwitch NV{lanes}", fontsize=6, va="center", color=green)
    for g, states in switch_gpus.items():
        x, y = p.pos[g]
        bad = sum(states) > len(states) / 2
        style = {"color": UNHEALTHY if bad else green, "lw": 1.0, "ls": "--" if bad else "-", "zorder": 1}
        if vertical:
            ax.plot([x, x, at], [y - GPU_RADIUS, y - 0.62, y - 0.62], **style)
        else:
            ax.plot([x, x], [y - GPU_RADIUS if at < y else y + GPU_RADIUS, at], **style)


def _draw_gpus_and_nics(ax: Any, p: Panel, patches: Any) -> None:
    for g in p.node.gpus:
        x, y = p.pos[g.index]
        ax.add_patch(patches.Circle((x, y), GPU_RADIUS, fc="#ffffff" if g.healthy else "#ffebe9",
                                    ec=UNHEALTHY if not g.healthy else "#24292f", lw=1.2, zorder=3))
        ax.text(x, y, f"GPU{g.index}", fontsize=6.5, ha="center", va="center", zorder=4)
        if not g.healthy:
            ax.text(x + 0.3, y + 0.3, "✕", color=UNHEALTHY, fontsize=9, zorder=5)
    for tile in p.tiles:
        ax.add_patch(patches.Rectangle((tile.x - NIC_W / 2, tile.icon_y - NIC_H / 2), NIC_W, NIC_H, fc="#fff8c5",
                                       ec="#9a6700", lw=0.8, zorder=3))
        _text(ax, tile.label, color="#24292f")
        edge = tile.icon_y + (-NIC_H / 2 if tile.above else NIC_H / 2)
        for gpu in tile.gpus:
            gx, gy = p.pos[gpu]
            dx, dy = tile.x - gx, edge - gy
            k = GPU_RADIUS / math.hypot(dx, dy)
            ax.plot([tile.x, gx + dx * k], [edge, gy + dy * k], color=KIND_COLOURS.get(tile.level, "#afb8c1"),
                    lw=0.7, ls=":", zorder=1)


def _draw_plan(ax: Any, panels: Mapping[str, Panel], plan: Mapping[str, Any], patches: Any) -> None:
    """Each placement outlined in its role's colour; its name is a caption of the panel."""
    for k, placement in enumerate(plan.get("placements", [])):
        colour = ROLE_COLOURS.get(str(placement.get("role")), "#8250df")
        pad = 0.48 + 0.04 * (k % 3)
        for node, gpus in plan_groups(placement).items():
            panel = panels.get(node)
            pts = [panel.pos[g] for g in gpus if g in panel.pos] if panel else []
            if not pts:
                continue
            xs, ys = [q[0] for q in pts], [q[1] for q in pts]
            ax.add_patch(patches.FancyBboxPatch((min(xs) - pad, min(ys) - pad), max(xs) - min(xs) + 2 * pad,
                                                max(ys) - min(ys) + 2 * pad, boxstyle="round,pad=0.02", fc="none",
                                                ec=colour, lw=2.0, zorder=6))


def _centre(panels: Mapping[str, Panel], plan: Mapping[str, Any], replica: str) -> tuple[float, float] | None:
    """The middle of a replica's GPUs (its first node's, for a gang) in the drawing, if drawn."""
    placement = next((p for p in plan.get("placements", []) if p.get("replica_id") == replica), None)
    if placement is None:
        return None
    for node, gpus in plan_groups(placement).items():
        panel = panels.get(node)
        pts = [panel.pos[g] for g in gpus if g in panel.pos] if panel else []
        if pts:
            return sum(q[0] for q in pts) / len(pts), sum(q[1] for q in pts) / len(pts)
    return None


def _draw_kv_paths(ax: Any, panels: Mapping[str, Panel], plan: Mapping[str, Any], patches: Any) -> None:
    """Each prefill->decode pair of `kv_paths` a curve from the prefill's GPUs to the decode's,
    coloured by verdict, dashed while the router avoids it."""
    for pair in plan.get("kv_paths") or []:
        a, b = _centre(panels, plan, str(pair.get("prefill"))), _centre(panels, plan, str(pair.get("decode")))
        if a is None or b is None or a == b:
            continue
        colour = VERDICT_COLOURS.get(str(pair.get("verdict")), "#6e7781")
        ax.add_patch(patches.FancyArrowPatch(a, b, arrowstyle="-|>", mutation_scale=9, color=colour, lw=1.8,
                                             ls="--" if pair.get("avoided") else "-", alpha=0.85,
                                             connectionstyle="arc3,rad=0.25", shrinkA=8, shrinkB=8, zorder=7))


def _legend(ax: Any, with_plan: bool, x: float, y: float, verdicts: tuple[str, ...] = ()) -> None:
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], color=KIND_COLOURS[LinkKind.NVLINK], lw=2, label="NVLink / NVSwitch (width: lanes)"),
        Line2D([], [], color=KIND_COLOURS[LinkKind.XGMI], lw=2, label="XGMI"),
        Line2D([], [], color=KIND_COLOURS[LinkKind.PIX], lw=1, ls=":", label="PCIe switch (PIX/PXB)"),
        Line2D([], [], color=UNHEALTHY, lw=1.5, ls="--", label="unhealthy link"),
        Line2D([], [], marker="s", color="#9a6700", ls="", markerfacecolor="#fff8c5",
               label="NIC: name · PCIe level to its GPUs"),
    ]
    if with_plan:
        handles += [Line2D([], [], color=c, lw=2, label=f"{role} replica") for role, c in ROLE_COLOURS.items()]
    handles += [Line2D([], [], color=VERDICT_COLOURS.get(v, "#6e7781"), lw=1.8, label=f"KV path {v}")
                for v in verdicts]
    if verdicts:
        handles.append(Line2D([], [], color="#6e7781", lw=1.8, ls="--", label="KV path avoided"))
    ax.legend(handles=handles, loc="upper left", fontsize=6, frameon=False, bbox_to_anchor=(x, y),
              bbox_transform=ax.transData, ncol=3, borderaxespad=0.0)


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def figure(topology: Topology, plan: Mapping[str, Any] | None = None, title: str = "") -> Any:
    """The drawing as a matplotlib figure (Agg), at INCH_PER_UNIT inches per layout unit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import patches

    lay = layout(topology, measure_text, plan)
    islands_n = len(lay.islands)
    more = f"  (+{lay.hidden_nodes} more nodes not drawn)" if lay.hidden_nodes else ""
    heading = (f"{title}  ·  {_count(topology.gpu_count, 'GPU')}, {_count(islands_n, 'island')}  ·  "
               f"fingerprint {topology.fingerprint()}{more}")
    heading_w = measure_text(heading, 9)[0] * UNIT_PER_PT
    left, top, bottom = lay.left, 0.75, -lay.height - 1.1
    right = max(lay.width + 0.3, left + heading_w + 0.2)
    fig = plt.figure(figsize=((right - left) * INCH_PER_UNIT, (top - bottom) * INCH_PER_UNIT), dpi=DPI)
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0))
    for panel in lay.panels:
        _draw_panel(ax, lay, panel, patches)
        _draw_links(ax, panel)
        _draw_gpus_and_nics(ax, panel, patches)
    if plan:
        _draw_plan(ax, {p.node.name: p for p in lay.panels}, plan, patches)
        _draw_kv_paths(ax, {p.node.name: p for p in lay.panels}, plan, patches)
    verdicts = tuple(sorted({str(k.get("verdict")) for k in (plan or {}).get("kv_paths") or []},
                            key=lambda v: (list(VERDICT_COLOURS).index(v) if v in VERDICT_COLOURS else 9, v)))
    ax.text(left + 0.05, top - 0.3, heading, fontsize=9, va="center")
    _legend(ax, bool(plan), left + 0.05, -lay.height - 0.25, verdicts)
    ax.set_xlim(left, right)
    ax.set_ylim(bottom, top)
    ax.set_aspect("equal")
    ax.axis("off")
    return fig


def draw(topology: Topology, out: Path, plan: Mapping[str, Any] | None = None, title: str = "") -> None:
    if out.suffix.lower() not in (".svg", ".png"):
        raise TopologyError(f"--out must end in .svg or .png, got {out.name!r}")
    fig = figure(topology, plan, title)
    import matplotlib.pyplot as plt

    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
