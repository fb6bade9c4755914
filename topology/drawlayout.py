"""Where everything of a topology drawing goes, before anything is drawn (pure; `topology.draw`
renders it with matplotlib).

The drawing has a fixed scale (`INCH_PER_UNIT`), so a label's size in points is a known size in
layout units and the layout can keep every label clear of every other and of every line:

- a node is a panel: its title, then one caption line per island worth naming and per note of
  the reader, then one band per socket (NUMA node) holding that socket's GPUs in a row;
- the socket's label sits at the top of the first band and at the bottom of the others, where
  no link reaches: NVSwitch stubs and links between rows cross the gap between bands only;
- NICs are tiles in lanes: the first row's above it, the others' below their row. A NIC group
  (same nearest GPUs, same PCIe level) is one tile. A group next to one or two GPUs is joined to
  them by lines and sits in the lane nearest its row; a group next to more (or to all GPUs)
  names them in its label and sits in the lanes further out, so no line crosses a label;
- lanes are packed left to right (a tile never overlaps another), and the panel widens to hold
  them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from topology.drawtext import compact_names, gpu_ranges, island_captions, plan_captions, wrap
from topology.islands import islands
from topology.kinds import LinkKind
from topology.model import Gpu, GpuRef, Island, Node, Topology

INCH_PER_UNIT = 0.62
UNIT_PER_PT = 1 / (72 * INCH_PER_UNIT)
GPU_STEP = 1.5
GPU_RADIUS = 0.4
ISLAND_HALF = 0.55
ARC_RAD = 0.35
NIC_W, NIC_H = 0.4, 0.26
LANE_GAP = 0.12
TILE_GAP = 0.18
PANEL_GAP = 0.8
MAX_NODES = 24
TITLE_PT, CAPTION_PT, HEADER_PT, NIC_PT = 9.0, 6.0, 6.0, 5.0
LINE_SPACING = 1.3

Measure = Callable[[str, float, bool], tuple[float, float]]
"""(text, font size in points, bold) -> (width, height) in points."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TextSpot:
    x: float
    y: float
    text: str
    size_pt: float
    ha: str = "left"
    va: str = "center"
    width: float = 0.0

    @property
    def right(self) -> float:
        return self.x + {"left": self.width, "center": self.width / 2}.get(self.ha, 0.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class NicTile:
    x: float
    icon_y: float
    label: TextSpot
    gpus: tuple[int, ...]
    """The GPUs joined to it by lines (empty: its label names them)."""
    above: bool
    level: LinkKind


@dataclass(frozen=True, slots=True, kw_only=True)
class Band:
    key: tuple[int | None, str | None]
    top: float
    bottom: float
    row_y: float
    header: TextSpot


@dataclass(frozen=True, slots=True, kw_only=True)
class Panel:
    node: Node
    x0: float
    y0: float
    width: float
    height: float
    pos: dict[int, tuple[float, float]]
    bands: tuple[Band, ...]
    title: TextSpot
    captions: tuple[tuple[TextSpot, str | None], ...]
    """Each caption with what its swatch shows: 'island:<id>' (the island's colour), 'role:<role>'
    (a placement's outline), None (a note: no swatch)."""
    tiles: tuple[NicTile, ...]
    switch_bar: tuple[str, float] | None = None
    """('h', y) a bar between (or under) the rows; ('v', x) a bar on the right."""
    arcs_below: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    panels: tuple[Panel, ...]
    islands: tuple[Island, ...]
    width: float
    height: float
    left: float = -0.3
    top: float = 0.3
    hidden_nodes: int = 0


def _row_key(gpu: Gpu) -> tuple[int | None, str | None]:
    return (gpu.numa_node, None if gpu.numa_node is not None else gpu.cpu_affinity)


def _units(measure: Measure, text: str, size_pt: float, bold: bool = False) -> tuple[float, float]:
    w, h = measure(text, size_pt, bold)
    return w * UNIT_PER_PT, max(h, size_pt * LINE_SPACING * (text.count("\n") + 1)) * UNIT_PER_PT


@dataclass(slots=True)
class _Group:
    names: list[str]
    gpus: tuple[int, ...]
    level: LinkKind
    row: int
    lined: bool
    above: bool
    desired_x: float = 0.0
    label: str = ""
    w: float = 0.0
    h: float = 0.0


def _nic_groups(node: Node, rows: Sequence[tuple[int | None, str | None]]) -> list[_Group]:
    row_of = {g.index: rows.index(_row_key(g)) for g in node.gpus}
    by: dict[tuple[tuple[int, ...], LinkKind], list[str]] = {}
    for nic in sorted(node.nics, key=lambda n: n.name):
        near = tuple(sorted(i for i in nic.nearest_gpus if i in row_of))
        by.setdefault((near, nic.level), []).append(nic.name)
    out = []
    for (near, level), names in by.items():
        near_rows = {row_of[i] for i in near}
        one_row = len(near_rows) == 1
        lined = one_row and len(near) <= 2 and not (len(near) == len(node.gpus) > 2)
        row = near_rows.pop() if one_row else len(rows) - 1
        out.append(_Group(names=names, gpus=near, level=level, row=row, lined=lined,
                          above=row == 0 and (one_row or len(rows) == 1)))
    return out


def _pack(groups: list[_Group], left: float) -> list[list[tuple[_Group, float]]]:
    """Lane 0: the lined groups, in order, pushed right where they would overlap; the other
    groups first-fit into lanes further out."""
    lanes: list[list[tuple[_Group, float]]] = [[]]
    right = left
    for g in sorted((g for g in groups if g.lined), key=lambda g: g.desired_x):
        x = max(g.desired_x, right + g.w / 2)
        lanes[0].append((g, x))
        right = x + g.w / 2 + TILE_GAP
    for g in sorted((g for g in groups if not g.lined), key=lambda g: g.desired_x):
        x = max(g.desired_x, left + g.w / 2)
        for lane in lanes[1:]:
            if all(abs(x - ox) >= (g.w + o.w) / 2 + TILE_GAP for o, ox in lane):
                lane.append((g, x))
                break
        else:
            lanes.append([(g, x)])
    return [lane for lane in lanes if lane]


def _arc_depth(node: Node, xs: dict[int, float], row: set[int]) -> float:
    """How far below its row the deepest arc of the row reaches (arcs join GPUs of one row that
    are not neighbours; a quadratic curve reaches half its control point's offset)."""
    depth = 0.0
    for link in node.links:
        if link.a in row and link.b in row and abs(xs[link.a] - xs[link.b]) > GPU_STEP + 0.1 \
                and drawn(link.kind, link.health.healthy):
            depth = max(depth, ARC_RAD * abs(xs[link.a] - xs[link.b]) / 2)
    return depth


def drawn(kind: LinkKind, healthy: bool) -> bool:
    return kind is not LinkKind.NVSWITCH and (kind.is_gpu_fabric or kind in (LinkKind.PIX, LinkKind.PXB)
                                              or not healthy)


class _PanelBuilder:
    def __init__(self, node: Node, isl: Sequence[Island], x0: float, y0: float, measure: Measure,
                 plan_captions: Sequence[tuple[str, str]] = ()) -> None:
        self.node, self.isl, self.x0, self.y0, self.measure = node, isl, x0, y0, measure
        self.plan_captions = plan_captions
        self.rows = sorted({_row_key(g) for g in node.gpus}, key=lambda r: (r[0] is None, r[0] or 0, r[1] or ""))
        self.switched = any(k.kind is LinkKind.NVSWITCH for k in node.links)
        self.vertical = self.switched and len(self.rows) > 2
        self.right = x0 + 1.0

    def text(self, x: float, y: float, text: str, size_pt: float, ha: str = "left", va: str = "center",
             bold: bool = False) -> TextSpot:
        w, _ = _units(self.measure, text, size_pt, bold)
        left = x - (w / 2 if ha == "center" else w if ha == "right" else 0.0)
        self.right = max(self.right, left + w + 0.2)
        return TextSpot(x=x, y=y, text=text, size_pt=size_pt, ha=ha, va=va, width=w)

    def build(self) -> Panel:
        node, x0 = self.node, self.x0
        order = {g: k for k, i in enumerate(self.isl) for g in i.gpus}
        xs: dict[int, float] = {}
        for key in self.rows:
            members = sorted((g.index for g in node.gpus if _row_key(g) == key),
                             key=lambda i: (order.get(GpuRef(node.name, i), 0), i))
            for k, idx in enumerate(members):
                xs[idx] = x0 + 1.2 + k * GPU_STEP
        self.right = max([self.right, *(x + ISLAND_HALF + 0.5 for x in xs.values())])
        y = self.y0 - 0.15
        rack = f"  rack {node.rack}" if node.rack else ""
        model = next((g.model for g in node.gpus if g.model), None) or node.machine or node.source_format
        title = self.text(x0 + 0.2, y - 0.15, f"{node.name}  ({model}){rack}", TITLE_PT, bold=True)
        y -= 0.3 + 0.12
        captions, y = self._captions(y)
        groups = _nic_groups(node, self.rows)
        for g in groups:
            g.label = self._tile_label(g)
            g.w, g.h = _units(self.measure, g.label, NIC_PT)
            g.w = max(g.w, NIC_W)
            centre = x0 + 1.2 + (max(xs.values(), default=x0 + 1.2) - x0 - 1.2) / 2
            g.desired_x = (sum(xs[i] for i in g.gpus) / len(g.gpus) if g.gpus and len(g.gpus) < len(node.gpus)
                           else centre)
        pos: dict[int, tuple[float, float]] = {}
        bands: list[Band] = []
        tiles: list[NicTile] = []
        switch_bar: tuple[str, float] | None = None
        for r, key in enumerate(self.rows):
            band, y, row_tiles = self._band(r, key, y, xs, pos, [g for g in groups if g.row == r])
            bands.append(band)
            tiles += row_tiles
            if self.switched and not self.vertical and r == 0 and len(self.rows) == 2:
                switch_bar = ("h", y - 0.25)
            y -= 0.5 if r < len(self.rows) - 1 else 0.1
        if not node.gpus:
            for line in wrap("no GPUs read from this source (see the note above)", 60):
                captions.append((self.text(x0 + 0.2, y, line, CAPTION_PT), None))
                y -= CAPTION_PT * LINE_SPACING * UNIT_PER_PT
            y -= 0.3
        if self.switched and len(self.rows) == 1:
            switch_bar = ("h", bands[0].row_y - ISLAND_HALF - 0.3)
        if self.vertical:
            between = [t.label for t in tiles if not t.above] + [b.header for b in bands[1:]]
            switch_bar = ("v", max([max(x for x, _ in pos.values()) + 1.1, *(t.right + 0.25 for t in between)]))
            self.right = max(self.right, switch_bar[1] + 1.6)
        elif switch_bar:
            self.right = max(self.right, max(x for x, _ in pos.values()) + 2.1)
        return Panel(node=node, x0=x0, y0=self.y0, width=self.right - x0, height=self.y0 - y + 0.1, pos=pos,
                     bands=tuple(bands), title=title, captions=tuple(captions), tiles=tuple(tiles),
                     switch_bar=switch_bar)

    def _captions(self, y: float) -> tuple[list[tuple[TextSpot, str | None]], float]:
        step = CAPTION_PT * LINE_SPACING * UNIT_PER_PT
        out: list[tuple[TextSpot, str | None]] = []
        swatched = [(f"island:{i}", text) for i, text in island_captions(self.node, self.isl)]
        for swatch, text in [*swatched, *self.plan_captions]:
            out.append((self.text(self.x0 + 0.55, y - step / 2, text, CAPTION_PT), swatch))
            y -= step + 0.04
        width_chars = max(50, int((self.right - self.x0 - 0.4) / (CAPTION_PT * 0.55 * UNIT_PER_PT)))
        for note in self.node.notes:
            for k, line in enumerate(wrap(f"note: {note}", width_chars)):
                out.append((self.text(self.x0 + 0.2 + (0.25 if k else 0.0), y - step / 2, line, CAPTION_PT), None))
                y -= step
        return out, y - 0.1

    def _tile_label(self, g: _Group) -> str:
        names = compact_names(g.names)
        if g.lined:
            return f"{names} · {g.level.name}" if "\n" not in names else f"{names}\n{g.level.name}"
        where = "all GPUs" if len(g.gpus) == len(self.node.gpus) else gpu_ranges(g.gpus)
        return f"{names}\n{g.level.name} to {where}"

    def _lanes(self, lanes: list[list[tuple[_Group, float]]], y: float, above: bool) -> tuple[list[NicTile], float]:
        """Lanes above a row run top down from the outermost; below one, from the innermost. A
        label sits on the far side of its icon, so the lines to the GPUs never cross it."""
        tiles = []
        for n, lane in enumerate(reversed(lanes) if above else lanes):
            lane_h = max(g.h for g, _ in lane)
            if above:
                icon_y = y - lane_h - 0.04 - NIC_H / 2
                label_y, va, y = icon_y + NIC_H / 2 + 0.04, "bottom", icon_y - NIC_H / 2 - LANE_GAP
            else:
                icon_y = y - (0.3 if n == 0 else 0.1) - NIC_H / 2
                label_y, va = icon_y - NIC_H / 2 - 0.04, "top"
                y = label_y - lane_h - LANE_GAP
            for g, x in lane:
                spot = self.text(x, label_y, g.label, NIC_PT, ha="center", va=va)
                tiles.append(NicTile(x=x, icon_y=icon_y, label=spot, gpus=g.gpus if g.lined else (),
                                     above=above, level=g.level))
        return tiles, y

    def _band(self, r: int, key: tuple[int | None, str | None], y: float, xs: dict[int, float],
              pos: dict[int, tuple[float, float]], groups: list[_Group]
              ) -> tuple[Band, float, list[NicTile]]:
        top = y
        cpus = next((g.cpu_affinity for g in self.node.gpus if _row_key(g) == key), None)
        label = f"NUMA {key[0] if key[0] is not None else '?'}" + (f" · CPUs {cpus}" if cpus else "")
        head_h = HEADER_PT * LINE_SPACING * UNIT_PER_PT
        header = None
        if r == 0:
            header = self.text(self.x0 + 0.2, y - 0.08 - head_h / 2, label, HEADER_PT)
            y -= head_h + 0.16
        tiles, y = self._lanes(_pack([g for g in groups if g.above], self.x0 + 0.2), y, above=True)
        row_y = y - (0.3 if tiles else 0.25) - ISLAND_HALF
        row = [g.index for g in self.node.gpus if _row_key(g) == key]
        for idx in row:
            pos[idx] = (xs[idx], row_y)
        y = min(row_y - ISLAND_HALF, row_y - _arc_depth(self.node, xs, set(row)) - 0.1)
        if self.vertical:
            y = min(y, row_y - 0.62 - 0.1)
        elif self.switched and len(self.rows) == 1:
            y = min(y, row_y - ISLAND_HALF - 0.45)
        below, y = self._lanes(_pack([g for g in groups if not g.above], self.x0 + 0.2), y, above=False)
        tiles += below
        if header is None:
            header = self.text(self.x0 + 0.2, y - 0.12 - head_h / 2, label, HEADER_PT)
            y -= head_h + 0.2
        return Band(key=key, top=top, bottom=y - 0.05, row_y=row_y, header=header), y - 0.05, tiles


def layout(topology: Topology, measure: Measure, plan: Mapping[str, Any] | None = None) -> Layout:
    """Panels in a grid (1, 2 or 3 columns), each as wide as its contents need."""
    isl = islands(topology)
    shown = topology.nodes[:MAX_NODES]
    cols = 1 if len(shown) == 1 else min(3 if len(shown) > 4 else 2, len(shown))
    panels: list[Panel] = []
    x, y, row_h, total_w = 0.0, 0.0, 0.0, 0.0
    named: set[str] = set()
    for k, node in enumerate(shown):
        if k and k % cols == 0:
            x, y, row_h = 0.0, y - row_h - PANEL_GAP, 0.0
        panel = _PanelBuilder(node, isl, x, y, measure, plan_captions(node, plan, named)).build()
        panels.append(panel)
        x += panel.width + PANEL_GAP
        row_h = max(row_h, panel.height)
        total_w = max(total_w, x - PANEL_GAP)
    return Layout(panels=tuple(panels), islands=tuple(isl), width=total_w, height=-y + row_h,
                  hidden_nodes=len(topology.nodes) - len(shown))
