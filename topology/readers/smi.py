"""Reader for `nvidia-smi topo -m` text.

Handles every variant seen in real captures: tab- or space-separated columns, headers that
are not aligned with the rows, a header whose separators were lost (split by the row labels),
no legend, NIC columns named `NICn` (resolved through the `NIC Legend:`) or by device
(`mlx5_0`), `NUMA Affinity` as a number, a list or `N/A`, an optional `GPU NUMA ID` column,
a blank `CPU Affinity` cell (Slurm-restricted nodes), trailing spaces, ANSI underline codes,
old legend wording (`SOC` for `SYS`).

Every row is checked against the header, GPU and NIC rows alike: each device has one row of
one legend code per column, X on the diagonal only, each cell equal to its mirror cell; GPU
rows then carry a value per affinity column the header names. Anything else raises
`ParseError` with one clear line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from itertools import pairwise

from topology.errors import ParseError
from topology.kinds import LinkKind
from topology.model import Gpu, Link, Nic, Node
from topology.nvswitch import upgrade_nvswitch
from topology.readers.build import (
    PCIE_CODES,
    NicLevels,
    link_for_cell,
    nics_from_levels,
)
from topology.readers.cpus import numa_node_of
from topology.readers.smi_layout import TAB_WIDTH, Header, Matrix, Word, is_cell, read_matrix

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_GPU_COL = re.compile(r"^GPU(\d+)$")
_NV = re.compile(r"^NV(\d+)$")
_LEGEND_ALIAS = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")

Cells = dict[str, tuple[str, ...]]
"""Row label -> its matrix cells, one per header device."""


def _gpu_indices(header: Header) -> list[tuple[int, int]]:
    out = []
    for col, name in enumerate(header.devices):
        m = _GPU_COL.match(name)
        if m:
            out.append((col, int(m.group(1))))
    if [idx for _, idx in out] != list(range(len(out))):
        raise ParseError("GPU columns are not GPU0..GPUn in order")
    return out


def _row_cells(name: str, words: Sequence[Word], devices: Sequence[str], is_gpu: bool) -> tuple[str, ...]:
    """One legend code per column; a GPU row's further words are its affinity values."""
    n = len(devices)
    for i, word in enumerate(words[:n]):
        if not is_cell(word.text):
            if len(words) < n and i == len(words) - 1:
                raise ParseError(f"truncated: row {name} ends mid-cell ({word.text!r}) after {i} of {n} cells")
            raise ParseError(f"unknown cell code {word.text!r} in row {name}, column {devices[i]}")
    if len(words) < n:
        raise ParseError(f"truncated: row {name} has {len(words)} of {n} cells")
    if not is_gpu and len(words) > n:
        raise ParseError(f"row {name} has {len(words)} cells, the header has {n} columns")
    return tuple(w.text for w in words[:n])


def _check_square(devices: Sequence[str], cells: Cells) -> None:
    """X on the diagonal and nowhere else; every cell equal to its mirror cell."""
    for i, a in enumerate(devices):
        for j, b in enumerate(devices):
            cell = cells[a][j]
            if i == j:
                if cell != "X":
                    raise ParseError(f"diagonal cell of {a} is {cell!r}, expected X")
            elif cell == "X":
                raise ParseError(f"cell {a}-{b} is X (self), but {a} and {b} are different devices")
            elif i < j and cells[b][i] != cell:
                raise ParseError(f"matrix not symmetric: {a}-{b} is {cell}, its mirror {b}-{a} is {cells[b][i]}")


def _cells(matrix: Matrix, gpu_names: set[str]) -> Cells:
    devices = matrix.header.devices
    cells: Cells = {}
    for name in devices:
        words = matrix.rows.get(name)
        if words is None:
            raise ParseError(f"truncated: row {name} is missing")
        cells[name] = _row_cells(name, words, devices, name in gpu_names)
    _check_square(devices, cells)
    return cells


def _blank_first(words: Sequence[Word], n: int) -> bool:
    """Is the first affinity cell blank? The step from the last matrix cell to the first value
    is then wider than any step between the row's cells (a whole column, not a separator).
    The self cell is printed ` X `: its column starts at the space before the X."""
    starts = [w.col - 1 if w.text == "X" else w.col for w in words[:n]]
    widest = max((b - a for a, b in pairwise(starts)), default=TAB_WIDTH)
    return words[n].col - starts[-1] > widest


def _affinity(name: str, words: Sequence[Word], header: Header) -> dict[str, str]:
    """A GPU row's values for the header's affinity columns (a blank first one left out)."""
    n, trailers = len(header.devices), header.trailers
    values = [w.text for w in words[n:]]
    if len(values) == len(trailers):
        return dict(zip(trailers, values, strict=True))
    if len(values) > len(trailers):
        raise ParseError(f"row {name} has {len(values)} values after its cells, "
                         f"the header has {len(trailers)} columns for them ({', '.join(trailers) or 'none'})")
    if values and len(values) == len(trailers) - 1 and _blank_first(words, n):
        return dict(zip(trailers[1:], values, strict=True))
    if not values:
        raise ParseError(f"truncated: row {name} ends after its cells, without its {', '.join(trailers)}")
    raise ParseError(f"truncated: row {name} has {len(values)} of its {len(trailers)} values "
                     f"({', '.join(trailers)})")


def _gpu(index: int, values: Mapping[str, str]) -> Gpu:
    cpu = values.get("CPU Affinity")
    return Gpu(
        index=index,
        numa_node=numa_node_of(values.get("NUMA Affinity")),
        cpu_affinity=None if cpu is None or cpu.upper() == "N/A" else cpu,
        gpu_numa_node=numa_node_of(values.get("GPU NUMA ID")),
    )


def _aliases(text: str) -> dict[str, str]:
    aliases: dict[str, str] = {}
    for raw in text.splitlines():
        m = _LEGEND_ALIAS.match(_ANSI.sub("", raw))
        if m:
            aliases[m.group(1)] = m.group(2)
    return aliases


def _nic_levels(header: Header, cells: Cells, gpu_cols: list[tuple[int, int]], aliases: Mapping[str, str]) -> NicLevels:
    levels: NicLevels = {}
    for col, name in enumerate(header.devices):
        if _GPU_COL.match(name):
            continue
        per_gpu: dict[int, LinkKind] = {}
        for _, idx in gpu_cols:
            code = cells[f"GPU{idx}"][col]
            per_gpu[idx] = LinkKind.PIX if _NV.match(code) else PCIE_CODES[code]
        levels[aliases.get(name, name)] = per_gpu
    return levels


def parse_smi(text: str, node_name: str = "node0") -> Node:
    matrix = read_matrix(text)
    header = matrix.header
    gpu_cols = _gpu_indices(header)
    cells = _cells(matrix, {f"GPU{idx}" for _, idx in gpu_cols})
    gpus = [_gpu(idx, _affinity(f"GPU{idx}", matrix.rows[f"GPU{idx}"], header)) for _, idx in gpu_cols]
    links: list[Link] = [
        link_for_cell(a, b, cells[f"GPU{a}"][col_b])
        for _, a in gpu_cols
        for col_b, b in gpu_cols
        if a < b
    ]
    nics: list[Nic] = nics_from_levels(_nic_levels(header, cells, gpu_cols, _aliases(text)))
    return Node(
        name=node_name,
        gpus=tuple(gpus),
        links=tuple(upgrade_nvswitch(links)),
        nics=tuple(nics),
        source_format="nvidia-smi",
    )
