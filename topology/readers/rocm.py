"""Reader for `rocm-smi --showtopo` text (AMD Instinct, XGMI).

rocm-smi prints three GPU-by-GPU tables (Weight, Hops, Link Type) and per-GPU NUMA lines.
Link type XGMI becomes kind `xgmi` (rocm-smi gives no lane count); a PCIE pair becomes `sys`,
because rocm-smi prints no finer PCIe level. NUMA comes from the `Numa Node` lines. rocm-smi
lists no NICs and no CPU affinity.
"""

from __future__ import annotations

import re

from topology.errors import ParseError
from topology.kinds import LinkKind
from topology.model import Gpu, Link, Node

_SECTION = re.compile(r"^=+\s*(.*?)\s*=+$")
_NUMA = re.compile(r"^GPU\[(\d+)\]\s*:\s*\(Topology\)\s*Numa Node\s*:\s*(-?\d+)\s*$")
_GPU = re.compile(r"^GPU(\d+)$")
_TYPES = {"XGMI": LinkKind.XGMI, "PCIE": LinkKind.SYS}

MARKER = "Link Type between two GPUs"


def _table(lines: list[str], title: str) -> dict[int, list[str]] | None:
    start = next((i for i, ln in enumerate(lines) if title in ln and _SECTION.match(ln.strip())), None)
    if start is None:
        return None
    header: list[int] | None = None
    rows: dict[int, list[str]] = {}
    for ln in lines[start + 1 :]:
        tokens = ln.split()
        if not tokens:
            continue
        if _SECTION.match(ln.strip()):
            break
        if header is None:
            if not all(_GPU.match(t) for t in tokens):
                raise ParseError(f"rocm-smi table {title!r}: expected a GPU header, got {ln.strip()!r}")
            header = [int(_GPU.match(t).group(1)) for t in tokens]  # type: ignore[union-attr]
            continue
        m = _GPU.match(tokens[0])
        if not m:
            break
        if len(tokens) - 1 != len(header):
            raise ParseError(f"truncated: rocm-smi row {tokens[0]} has {len(tokens) - 1} of {len(header)} cells")
        rows[int(m.group(1))] = tokens[1:]
    if header is None or header != list(range(len(header))):
        raise ParseError(f"rocm-smi table {title!r} has no GPU0..GPUn header")
    if sorted(rows) != header:
        raise ParseError(f"truncated: rocm-smi table {title!r} is missing GPU rows")
    return rows


def parse_rocm(text: str, node_name: str = "node0") -> Node:
    lines = text.splitlines()
    types = _table(lines, MARKER)
    if types is None:
        raise ParseError("no rocm-smi 'Link Type between two GPUs' table found")
    n = len(types)
    numa: dict[int, int | None] = {}
    for ln in lines:
        m = _NUMA.match(ln.strip())
        if m:
            value = int(m.group(2))
            numa[int(m.group(1))] = value if value >= 0 else None
    links: list[Link] = []
    for a in range(n):
        for b in range(n):
            cell = types[a][b].upper()
            if a == b:
                continue
            if cell not in _TYPES:
                raise ParseError(f"unknown link type {types[a][b]!r} between GPU{a} and GPU{b}")
            if a < b:
                if types[b][a].upper() != cell:
                    raise ParseError(f"link type table not symmetric at GPU{a}-GPU{b}")
                links.append(Link(a=a, b=b, kind=_TYPES[cell]))
    gpus = tuple(Gpu(index=i, numa_node=numa.get(i)) for i in range(n))
    return Node(name=node_name, gpus=gpus, links=tuple(links), source_format="rocm-smi")
