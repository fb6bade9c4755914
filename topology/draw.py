"""Draw a topology as SVG or PNG: nodes as panels, NUMA domains as bands, GPUs grouped by island,
NVLink/XGMI coloured by kind (width by lanes), NVSwitch fabrics as a bar, PCIe switch pairs
dotted, unhealthy links and GPUs in red, NICs under their nearest GPUs with the PCIe level,
and optionally a placement plan's replicas outlined by role.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topology.errors import TopologyError
from topology.islands import islands
from topology.kinds import LinkKind
from topology.model import Gpu, GpuRef, Island, Node, Topology

MAX_NODES = 24
GPU_STEP = 1.5
ROW_STEP = 2.6
TOP = 1.9
ISLAND_COLOURS = ["#cfe8ff", "#d8f5d0", "#ffe7c2", "#f3d5f7", "#fff3b0", "#d0f0ee", "#ffd6d6", "#e2e2f8"]
KIND_COLOURS = {LinkKind.NVSWITCH: "#1a7f37", LinkKind.NVLINK: "#1a7f37", LinkKind.XGMI: "#0e7c86",
                LinkKind.PIX: "#6e7781", LinkKind.PXB: "#8c959f", LinkKind.PHB: "#afb8c1",
                LinkKind.NODE: "#afb8c1", LinkKind.SYS: "#d0d7de"}
ROLE_COLOURS = {"prefill": "#d4a72c", "decode": "#0969da", "mixed": "#8250df"}
UNHEALTHY = "#cf222e"


@dataclass(frozen=True, slots=True)
class _Panel:
    node: Node
    x0: float
    y0: float
    width: float
    height: float
    pos: dict[int, tuple[float, float]]
    rows: list[tuple[int | None, str | None]]


def _layout_node(node: Node, isl: Sequence[Island], x0: float, y0: float) -> _Panel:
    order = {g: k for k, i in enumerate(isl) for g in i.gpus}
    # One band per socket: the NUMA node, or the CPU list where the capture has no NUMA column.
    rows = sorted({_row_key(g) for g in node.gpus}, key=lambda r: (r[0] is None, r[0] or 0, r[1] or ""))
    pos: dict[int, tuple[float, float]] = {}
    widest = 1
    for r, key in enumerate(rows):
        members = sorted((g.index for g in node.gpus if _row_key(g) == key),
                         key=lambda i: (order.get(GpuRef(node.name, i), 0), i))
        widest = max(widest, len(members))
        for k, idx in enumerate(members):
            pos[idx] = (x0 + 1.2 + k * GPU_STEP, y0 - TOP - r * ROW_STEP)
    switched = any(k.kind is LinkKind.NVSWITCH for k in node.links)
    width = 1.2 + widest * GPU_STEP + (2.2 if switched and len(rows) > 2 else 0.6)
    bottom = 1.3 if (node.nics and len(rows) == 1) or (switched and len(rows) == 1) else 0.3
    height = TOP - 1.3 + len(rows) * ROW_STEP + bottom
    return _Panel(node, x0, y0, width, height, pos, rows)


def _row_key(gpu: Gpu) -> tuple[int | None, str | None]:
    return (gpu.numa_node, None if gpu.numa_node is not None else gpu.cpu_affinity)


def _draw_panel(ax: Any, p: _Panel, isl: Sequence[Island], patches: Any) -> None:
    node = p.node
    ax.add_patch(patches.FancyBboxPatch((p.x0, p.y0 - p.height), p.width, p.height, boxstyle="round,pad=0.05",
                                        fc="white", ec="#57606a", lw=1.2))
    model = next((g.model for g in node.gpus if g.model), None) or node.machine or node.source_format
    rack = f"  rack {node.rack}" if node.rack else ""
    ax.text(p.x0 + 0.2, p.y0 - 0.35, f"{node.name}  ({model}){rack}", fontsize=9, weight="bold", va="center")
    cpus = {_row_key(g): g.cpu_affinity for g in node.gpus}
    for r, key in enumerate(p.rows):
        y = p.y0 - TOP - r * ROW_STEP
        ax.add_patch(patches.Rectangle((p.x0 + 0.1, y - 1.2), p.width - 0.2, 2.4, fc="#f6f8fa", ec="none"))
        numa = key[0]
        label = f"NUMA {numa if numa is not None else '?'}" + (f" · CPUs {cpus[key]}" if cpus.get(key) else "")
        ax.text(p.x0 + 0.2, y - 1.1, label, fontsize=6, color="#57606a")
    for k, i in enumerate(x for x in isl if node.name in x.nodes):
        pts = [p.pos[g.index] for g in i.gpus if g.node == node.name]
        colour = ISLAND_COLOURS[k % len(ISLAND_COLOURS)]
        for n, row_y in enumerate(sorted({q[1] for q in pts}, reverse=True)):
            xs = [q[0] for q in pts if q[1] == row_y]
            ax.add_patch(patches.FancyBboxPatch((min(xs) - 0.55, row_y - 0.55), max(xs) - min(xs) + 1.1, 1.1,
                                                boxstyle="round,pad=0.05", fc=colour, ec="#8c959f", lw=0.8))
            tag = "NVL domain" if len(i.nodes) > 1 else ("" if i.fully_connected else "not a full mesh")
            if n == 0 and len(i.gpus) > 1 and i.kind is not None and tag:
                ax.text(max(xs) + 0.5, row_y - 0.68, f"{i.kind.label} island, {tag}", fontsize=5.5,
                        color="#24292f", ha="right", va="top")


def _draw_links(ax: Any, p: _Panel) -> None:
    node = p.node
    switch_gpus: dict[int, list[bool]] = {}
    for link in node.links:
        (xa, ya), (xb, yb) = p.pos[link.a], p.pos[link.b]
        bad = not link.health.healthy
        if link.kind is LinkKind.NVSWITCH:
            switch_gpus.setdefault(link.a, []).append(bad)
            switch_gpus.setdefault(link.b, []).append(bad)
            continue
        if link.kind.is_gpu_fabric or link.kind in (LinkKind.PIX, LinkKind.PXB) or bad:
            width = 0.6 + 0.5 * (link.lanes or 1) if link.kind.is_gpu_fabric else 0.6
            style = "--" if bad else (":" if not link.kind.is_gpu_fabric else "-")
            colour = UNHEALTHY if bad else KIND_COLOURS.get(link.kind, "#afb8c1")
            rad = 0.35 if abs(ya - yb) < 0.01 and abs(xa - xb) > GPU_STEP + 0.1 else 0.0
            ax.annotate("", xy=(xb, yb), xytext=(xa, ya), arrowprops={
                "arrowstyle": "-", "color": colour, "lw": width, "linestyle": style,
                "connectionstyle": f"arc3,rad={rad}", "shrinkA": 9, "shrinkB": 9})
    if switch_gpus:
        _draw_switch(ax, p, switch_gpus, max((k.lanes or 0) for k in node.links if k.kind is LinkKind.NVSWITCH))


def _draw_switch(ax: Any, p: _Panel, switch_gpus: Mapping[int, list[bool]], lanes: int) -> None:
    """Rows 1-2: a bar between (or under) the rows. More rows: a bar on the right, elbow stubs."""
    green = KIND_COLOURS[LinkKind.NVSWITCH]
    row_ys = sorted({p.pos[g][1] for g in switch_gpus}, reverse=True)
    xs = [p.pos[g][0] for g in switch_gpus]
    vertical = len(row_ys) > 2
    if vertical:
        bar_x = max(xs) + 1.1
        ax.plot([bar_x, bar_x], [row_ys[-1] - 0.62, row_ys[0]], color=green, lw=3)
        ax.text(bar_x + 0.1, row_ys[0] + 0.3, f"NVSwitch NV{lanes}", fontsize=6, color=green)
    else:
        bar_y = (row_ys[0] + row_ys[1]) / 2 if len(row_ys) == 2 else row_ys[0] - 1.0
        ax.plot([min(xs) - 0.3, max(xs) + 0.3], [bar_y, bar_y], color=green, lw=3)
        ax.text(max(xs) + 0.45, bar_y, f"NVSwitch NV{lanes}", fontsize=6, va="center", color=green)
    for g, states in switch_gpus.items():
        x, y = p.pos[g]
        bad = sum(states) > len(states) / 2
        style = {"color": UNHEALTHY if bad else green, "lw": 1.0, "ls": "--" if bad else "-", "zorder": 1}
        if vertical:
            ax.plot([x, x, bar_x], [y - 0.4, y - 0.62, y - 0.62], **style)
        else:
            ax.plot([x, x], [y - 0.4 if bar_y < y else y + 0.4, bar_y], **style)


def _draw_gpus_and_nics(ax: Any, p: _Panel, patches: Any) -> None:
    node = p.node
    for g in node.gpus:
        x, y = p.pos[g.index]
        ax.add_patch(patches.Circle((x, y), 0.4, fc="#ffffff" if g.healthy else "#ffebe9",
                                    ec=UNHEALTHY if not g.healthy else "#24292f", lw=1.2, zorder=3))
        ax.text(x, y, f"GPU{g.index}", fontsize=6.5, ha="center", va="center", zorder=4)
        if not g.healthy:
            ax.text(x + 0.3, y + 0.3, "✕", color=UNHEALTHY, fontsize=9, zorder=5)
    slots: dict[tuple[float, float], int] = {}
    bottom = p.y0 - p.height + 0.35
    for nic in sorted(node.nics, key=lambda n: n.name):
        near = [p.pos[i] for i in nic.nearest_gpus if i in p.pos]
        everywhere = len(nic.nearest_gpus) == len(node.gpus) and len(node.gpus) > 2
        x = sum(q[0] for q in near) / len(near) if near and not everywhere else p.x0 + p.width / 2
        above = len(p.rows) > 1 and near and max(q[1] for q in near) >= p.y0 - TOP - 0.01
        y = (max(q[1] for q in near) + 0.85 if above else min(q[1] for q in near) - 0.85) \
            if near and not everywhere else bottom
        k = slots.get((round(x, 1), round(y, 1)), 0)
        slots[(round(x, 1), round(y, 1))] = k + 1
        x += 0.5 * k
        ax.add_patch(patches.Rectangle((x - 0.2, y - 0.13), 0.4, 0.26, fc="#fff8c5", ec="#9a6700", lw=0.8, zorder=3))
        ax.text(x, y - 0.27, nic.name, fontsize=4.5, ha="center", va="top", rotation=0)
        if not everywhere:
            for gx, gy in near:
                ax.plot([x, gx], [y + 0.13, gy - 0.4], color=KIND_COLOURS.get(nic.level, "#afb8c1"), lw=0.6,
                        ls=":", zorder=1)
        ax.text(x + 0.25, y + 0.05, nic.level.name, fontsize=4, color="#57606a")


def _plan_groups(placement: Mapping[str, Any]) -> dict[str, list[int]]:
    """A placement's GPUs per node: its group, a gang's members (one box per node), or a group
    a baseline spread over nodes (`extra_nodes`)."""
    out: dict[str, list[int]] = {}
    members = placement.get("members") or [{"node": placement.get("node"), "gpus": placement.get("gpus", [])}]
    for m in members:
        out.setdefault(str(m.get("node")), []).extend(int(g) for g in m.get("gpus", []))
    for node, gpus in (placement.get("extra_nodes") or {}).items():
        if not placement.get("members"):
            out.setdefault(str(node), []).extend(int(g) for g in gpus)
    return out


def _plan_label(placement: Mapping[str, Any]) -> str:
    label = str(placement.get("replica_id", ""))
    experts = placement.get("experts")
    if placement.get("members"):
        label += f" ({len(placement['members'])} ranks{'' if placement.get('in_domain') else ', spans domains'})"
    if experts:
        label += (f"; experts {experts.get('policy')}: balance {float(experts.get('balancedness', 0)):.2f}, "
                  f"{float(experts.get('cross_domain_share', 0)):.0%} cross")
    return label


def _domain_share(placement: Mapping[str, Any], node: str) -> float | None:
    """The expert-load share of the domain a gang's node belongs to (`<node>/islandN`)."""
    loads = (placement.get("experts") or {}).get("domain_load") or {}
    mine = [float(x) for d, x in loads.items() if str(d).startswith(f"{node}/")]
    return mine[0] if len(mine) == 1 else None


def _draw_plan(ax: Any, panels: Mapping[str, _Panel], plan: Mapping[str, Any], patches: Any) -> None:
    for k, placement in enumerate(plan.get("placements", [])):
        colour = ROLE_COLOURS.get(str(placement.get("role")), "#8250df")
        pad = 0.48 + 0.04 * (k % 3)
        labelled = False
        for node, gpus in _plan_groups(placement).items():
            panel = panels.get(node)
            if panel is None:
                continue
            pts = [panel.pos[g] for g in gpus if g in panel.pos]
            if not pts:
                continue
            xs, ys = [q[0] for q in pts], [q[1] for q in pts]
            ax.add_patch(patches.FancyBboxPatch((min(xs) - pad, min(ys) - pad), max(xs) - min(xs) + 2 * pad,
                                                max(ys) - min(ys) + 2 * pad, boxstyle="round,pad=0.02", fc="none",
                                                ec=colour, lw=2.0, zorder=6))
            text = _plan_label(placement) if not labelled else str(placement.get("replica_id", ""))
            share = _domain_share(placement, node)
            if share is not None:
                text += f"; {share:.0%} of its expert load in this node's domain"
            ax.text(min(xs) - pad, min(ys) - pad - 0.12, text, fontsize=5, color=colour, va="top", zorder=6)
            labelled = True


def _legend(ax: Any, with_plan: bool) -> None:
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], color=KIND_COLOURS[LinkKind.NVLINK], lw=2, label="NVLink / NVSwitch (width: lanes)"),
        Line2D([], [], color=KIND_COLOURS[LinkKind.XGMI], lw=2, label="XGMI"),
        Line2D([], [], color=KIND_COLOURS[LinkKind.PIX], lw=1, ls=":", label="PCIe switch (PIX/PXB)"),
        Line2D([], [], color=UNHEALTHY, lw=1.5, ls="--", label="unhealthy link"),
        Line2D([], [], marker="s", color="#9a6700", ls="", markerfacecolor="#fff8c5", label="NIC (level to GPUs)"),
    ]
    if with_plan:
        handles += [Line2D([], [], color=c, lw=2, label=f"{role} replica") for role, c in ROLE_COLOURS.items()]
    ax.legend(handles=handles, loc="upper left", fontsize=6, frameon=False, bbox_to_anchor=(0.0, 0.0), ncol=3)


def draw(topology: Topology, out: Path, plan: Mapping[str, Any] | None = None, title: str = "") -> None:
    if out.suffix.lower() not in (".svg", ".png"):
        raise TopologyError(f"--out must end in .svg or .png, got {out.name!r}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import patches

    isl = islands(topology)
    shown = topology.nodes[:MAX_NODES]
    cols = 1 if len(shown) == 1 else min(3 if len(shown) > 4 else 2, len(shown))
    panels: dict[str, _Panel] = {}
    x, y, row_h, total_w = 0.0, 0.0, 0.0, 0.0
    for k, node in enumerate(shown):
        if k and k % cols == 0:
            x, y, row_h = 0.0, y - row_h - 0.8, 0.0
        panel = _layout_node(node, isl, x, y)
        panels[node.name] = panel
        x += panel.width + 0.8
        row_h = max(row_h, panel.height)
        total_w = max(total_w, x)
    height = -y + row_h
    fig, ax = plt.subplots(figsize=(max(6.0, total_w * 0.62), max(3.5, height * 0.62 + 0.8)))
    for panel in panels.values():
        _draw_panel(ax, panel, isl, patches)
        _draw_links(ax, panel)
        _draw_gpus_and_nics(ax, panel, patches)
    if plan:
        _draw_plan(ax, panels, plan, patches)
    more = f"  (+{len(topology.nodes) - len(shown)} more nodes not drawn)" if len(topology.nodes) > len(shown) else ""
    ax.set_title(f"{title}  ·  {topology.gpu_count} GPUs, {len(isl)} islands  ·  fingerprint "
                 f"{topology.fingerprint()}{more}", fontsize=9, loc="left")
    _legend(ax, bool(plan))
    ax.set_xlim(-0.3, total_w)
    ax.set_ylim(-height - 0.3, 1.2)
    ax.set_aspect("equal")
    ax.axis("off")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=160, bbox_inches="tight")
    plt.close(fig)
