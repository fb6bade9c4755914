"""Parse and draw many sources at once, print their islands: the first thing to run on a new
fleet (and, until the local deployment exists, what `make run` does)."""

from __future__ import annotations

import sys
from pathlib import Path

from topology.draw import draw
from topology.errors import TopologyError
from topology.islands import islands
from topology.readers import ReadOptions, read_source
from topology.summary import format_gpus


def _islands_line(source: Path, options: ReadOptions) -> tuple[str, object]:
    topology = read_source(str(source), options)
    parts = [format_gpus(isl.gpus, single_node=len(topology.nodes) == 1) for isl in islands(topology)]
    line = (f"{source.name}: {topology.gpu_count} GPUs on {len(topology.nodes)} node(s), "
            f"fingerprint {topology.fingerprint()}, islands " + (" ".join(parts) or "(no GPUs)"))
    notes = [f"\n    note: {n}" for node in topology.nodes for n in node.notes]
    return line + "".join(notes), topology


def survey(sources: list[Path], out_dir: Path, options: ReadOptions) -> int:
    """Returns 2 when any source failed (after doing all the others), else 0."""
    failed = 0
    for source in sources:
        try:
            line, topology = _islands_line(source, options)
            picture = out_dir / f"{source.stem}.svg"
            draw(topology, picture, title=source.name)  # type: ignore[arg-type]
        except TopologyError as err:
            print(f"error: {err}", file=sys.stderr)
            failed += 1
            continue
        print(f"{line}\n    -> {picture}")
    return 2 if failed else 0
