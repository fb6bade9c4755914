"""Reader for `nvidia-smi topo -m` text.

Handles every variant seen in real captures: tab- or space-separated columns, headers that
are not aligned with the rows, no legend, NIC columns named `NICn` (resolved through the
`NIC Legend:`) or by device (`mlx5_0`), `NUMA Affinity` as a number, a list or `N/A`, an
optional `GPU NUMA ID` column, trailing spaces, ANSI underline codes, old legend wording
(`SOC` for `SYS`). Anything it cannot read raises `ParseError` with one clear line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from topology.errors import ParseError
from topology.kinds import LinkKind
from topology.model import Gpu, Link, Nic, Node
from topology.readers.build import (
    PCIE_CODES,
    NicLevels,
    link_for_cell,
    nics_from_levels,
    upgrade_nvswitch,
)
from topology.readers.cpus import numa_node_of

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_GPU_COL = re.compile(r"^GPU(\d+)$")
_NV = re.compile(r"^NV(\d+)$")
_LEGEND_ALIAS = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
_TRAILERS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")


def _is_cell(token: str) -> bool:
    return token == "X" or token in PCIE_CODES or bool(_NV.match(token))


@dataclass(frozen=True, slots=True)
class _Header:
    devices: list[str]
    trailers: list[str]
    line_no: int


def _find_header(lines: list[list[str]]) -> _Header:
    for no, tokens in enumerate(lines):
        if not tokens or tokens[0] != "GPU0" or (len(tokens) > 1 and _is_cell(tokens[1])):
            continue
        devices: list[str] = []
        i = 0
        while i < len(tokens) and tokens[i] not in ("CPU", "NUMA") and tokens[i : i + 2] != ["GPU", "NUMA"]:
            devices.append(tokens[i])
            i += 1
        rest = " ".join(tokens[i:])
        trailers: list[str] = []
        for name in _TRAILERS:
            if rest.startswith(name):
                trailers.append(name)
                rest = rest[len(name) :].lstrip()
        if rest:
            raise ParseError(f"unrecognised header column {rest!r}")
        return _Header(devices, trailers, no)
    raise ParseError("no `nvidia-smi topo -m` matrix found (expected a header line starting with GPU0)")


def _rows(lines: list[list[str]], header: _Header) -> dict[str, list[str]]:
    names = set(header.devices)
    rows: dict[str, list[str]] = {}
    for tokens in lines[header.line_no + 1 :]:
        if not tokens:
            continue  # blank lines between rows (\r\r\n endings, pasted captures)
        label = tokens[0]
        if label not in names:
            if rows:
                break
            continue
        if label in rows:
            raise ParseError(f"row {label} appears twice")
        rows[label] = tokens[1:]
    return rows


def _cell(rows: dict[str, list[str]], header: _Header, row: str, col: int) -> str:
    cells = rows[row]
    if col >= len(cells):
        raise ParseError(f"truncated: row {row} has {len(cells)} of {len(header.devices)} cells")
    token = cells[col]
    if not _is_cell(token):
        raise ParseError(f"unknown cell code {token!r} in row {row}, column {header.devices[col]}")
    return token


def _gpu_indices(header: _Header) -> list[tuple[int, int]]:
    out = []
    for col, name in enumerate(header.devices):
        m = _GPU_COL.match(name)
        if m:
            out.append((col, int(m.group(1))))
    if [idx for _, idx in out] != list(range(len(out))):
        raise ParseError("GPU columns are not GPU0..GPUn in order")
    return out


def _trailer_values(header: _Header, cells: list[str]) -> dict[str, str]:
    extra = cells[len(header.devices) :]
    return {name: extra[i] for i, name in enumerate(header.trailers) if i < len(extra)}


def parse_smi(text: str, node_name: str = "node0") -> Node:
    lines = [_ANSI.sub("", raw).replace("\t", " ").split() for raw in text.splitlines()]
    header = _find_header(lines)
    rows = _rows(lines, header)
    gpu_cols = _gpu_indices(header)
    for _, idx in gpu_cols:
        if f"GPU{idx}" not in rows:
            raise ParseError(f"truncated: row GPU{idx} is missing")
    aliases: dict[str, str] = {}
    for raw in text.splitlines():
        m = _LEGEND_ALIAS.match(_ANSI.sub("", raw))
        if m:
            aliases[m.group(1)] = m.group(2)

    gpus: list[Gpu] = []
    for _, idx in gpu_cols:
        extra = _trailer_values(header, rows[f"GPU{idx}"])
        cpu = extra.get("CPU Affinity")
        gpus.append(
            Gpu(
                index=idx,
                numa_node=numa_node_of(extra.get("NUMA Affinity")),
                cpu_affinity=None if cpu is None or cpu.upper() == "N/A" else cpu,
                gpu_numa_node=numa_node_of(extra.get("GPU NUMA ID")),
            )
        )

    links: list[Link] = []
    for col_a, a in gpu_cols:
        for col_b, b in gpu_cols:
            cell = _cell(rows, header, f"GPU{a}", col_b)
            if a == b:
                if cell != "X":
                    raise ParseError(f"diagonal cell of GPU{a} is {cell!r}, expected X")
                continue
            if a < b:
                back = _cell(rows, header, f"GPU{b}", col_a)
                if back != cell:
                    raise ParseError(f"matrix not symmetric: GPU{a}-GPU{b} is {cell}, GPU{b}-GPU{a} is {back}")
                links.append(link_for_cell(a, b, cell))

    levels: NicLevels = {}
    for col, name in enumerate(header.devices):
        if _GPU_COL.match(name):
            continue
        nic_name = aliases.get(name, name)
        per_gpu: dict[int, LinkKind] = {}
        for _, idx in gpu_cols:
            code = _cell(rows, header, f"GPU{idx}", col)
            nv = _NV.match(code)
            per_gpu[idx] = LinkKind.PIX if nv else PCIE_CODES[code] if code != "X" else LinkKind.PIX
        levels[nic_name] = per_gpu
    nics: list[Nic] = nics_from_levels(levels)
    return Node(
        name=node_name,
        gpus=tuple(gpus),
        links=tuple(upgrade_nvswitch(links)),
        nics=tuple(nics),
        source_format="nvidia-smi",
    )
