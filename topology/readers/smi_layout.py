"""Layout of `nvidia-smi topo -m` text: words with their columns, the header, the matrix rows.

The matrix is square over the devices: the header names them (GPU0..GPUn, then the NICs as
`NICn` or by device, `mlx5_0`), then the affinity columns (`CPU Affinity`, `NUMA Affinity`,
`GPU NUMA ID`); one row follows per device, labelled with its header name and in the same
order. So the row labels also say what the header must read: a header whose separators were
lost (`GPU0GPU1...mlx5_0CPU Affinity`, as one DGX-1 capture prints it) is split by them, and
one that does not split into them is refused with what it reads where they part.

Words keep their column (tabs expanded to stops of 8, as a terminal shows them) because a
blank cell is only visible as a gap wider than a separator.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from topology.errors import ParseError
from topology.readers.build import PCIE_CODES

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_NV = re.compile(r"^NV(\d+)$")
_WORD = re.compile(r"\S+")
TRAILERS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
"""The affinity columns after the matrix, in the order nvidia-smi prints the ones it has."""
TAB_WIDTH = 8


@dataclass(frozen=True, slots=True)
class Word:
    text: str
    col: int
    """Column of the word's first character, tabs expanded."""


@dataclass(frozen=True, slots=True)
class Header:
    devices: tuple[str, ...]
    trailers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Matrix:
    header: Header
    rows: Mapping[str, tuple[Word, ...]]
    """Row label -> the words after it, in the order the rows appear."""


def is_cell(text: str) -> bool:
    """A code of the legend: X (self), SYS/SOC, NODE, PHB, PXB, PIX, NV#."""
    return text == "X" or text in PCIE_CODES or bool(_NV.match(text))


def words_of(line: str) -> list[Word]:
    expanded = line.expandtabs(TAB_WIDTH)
    return [Word(m.group(), m.start()) for m in _WORD.finditer(expanded)]


def _header_line(lines: Sequence[Sequence[Word]]) -> int:
    for no, words in enumerate(lines):
        if words and words[0].text.startswith("GPU0") and not (len(words) > 1 and is_cell(words[1].text)):
            return no
    raise ParseError("no `nvidia-smi topo -m` matrix found (expected a header line starting with GPU0)")


def _split_words(words: list[str]) -> tuple[list[str], list[str], str]:
    """Header words -> device names, affinity columns, and any text that is neither."""
    i = 0
    while i < len(words) and words[i] not in ("CPU", "NUMA") and words[i : i + 2] != ["GPU", "NUMA"]:
        i += 1
    rest = " ".join(words[i:])
    trailers: list[str] = []
    for name in TRAILERS:
        if rest.startswith(name):
            trailers.append(name)
            rest = rest[len(name) :].lstrip()
    return words[:i], trailers, rest


def _split_compact(line: str) -> tuple[str, tuple[str, ...]]:
    """A header with its whitespace removed -> the device names run together, the affinity columns."""
    compact = "".join(line.split())
    found: list[str] = []
    for name in reversed(TRAILERS):
        key = name.replace(" ", "")
        if compact.endswith(key):
            compact = compact[: -len(key)]
            found.insert(0, name)
    return compact, tuple(found)


def _where_parted(compact: str, labels: Sequence[str]) -> str:
    pos = 0
    for label in labels:
        if not compact.startswith(label, pos):
            return (f"the header's column names run together and do not split into the row labels: "
                    f"row {label} where the header reads {compact[pos : pos + 16]!r}")
        pos += len(label)
    return (f"truncated: no row for {compact[pos:]!r}, which the header names after {labels[-1]} "
            "(its column names run together)")


def _resolve_header(line: str, words: list[str], labels: list[str]) -> Header:
    devices, trailers, rest = _split_words(words)
    if not rest and devices == labels:
        return Header(tuple(devices), tuple(trailers))
    compact, found = _split_compact(line)
    if compact == "".join(labels):
        return Header(tuple(labels), found)  # separators lost: the row labels split it
    if rest:
        raise ParseError(f"unrecognised header column {rest!r}")
    if len(devices) < len(labels) and any(name not in labels for name in devices):
        raise ParseError(_where_parted(compact, labels))
    return Header(tuple(devices), tuple(trailers))


def _row_block(lines: Sequence[Sequence[Word]], names: set[str]) -> dict[str, tuple[Word, ...]]:
    """The rows after the header: lines labelled with a header name or followed by a cell code,
    blank lines between them skipped, up to the first line that is neither (the legend)."""
    rows: dict[str, tuple[Word, ...]] = {}
    for words in lines:
        if not words:
            continue  # blank lines between rows (\r\r\n endings, pasted captures)
        label = words[0].text
        if label in names or (len(words) > 1 and is_cell(words[1].text)):
            if label in rows:
                raise ParseError(f"row {label} appears twice")
            rows[label] = tuple(words[1:])
        elif rows:
            break
    return rows


def read_matrix(text: str) -> Matrix:
    """The header and the rows of a capture, every row label a header column."""
    raws = [_ANSI.sub("", raw) for raw in text.splitlines()]
    lines = [words_of(raw) for raw in raws]
    at = _header_line(lines)
    words = [w.text for w in lines[at]]
    rows = _row_block(lines[at + 1 :], set(_split_words(words)[0]))
    if not rows:
        raise ParseError("truncated: no matrix rows after the header")
    header = _resolve_header(raws[at], words, list(rows))
    for label in rows:
        if label not in header.devices:
            raise ParseError(f"row {label} is not a column of the header")
    return Matrix(header, rows)
