"""Every topology source behind one call: `read_source(SOURCE)` -> `Topology`.

SOURCE is a file (`nvidia-smi topo -m` text, `rocm-smi --showtopo` text, NCCL topology XML,
a cluster spec YAML, or a topology JSON written by this package), the name of a shipped
machine template (`hgx-h100`), or `nvml` for live discovery on this machine. The format is
detected from the content, never from the file name.

Holds one module per source format (`smi`, `rocm`, `nccl`, `nvml`, `spec`, ...) and
`capture` (one machine's capture -> Node). Imports nothing outside `topology`; the readers
never import this package back (tests/house/test_import_graph.py checks).
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from topology.errors import ParseError
from topology.model import Topology
from topology.readers.capture import MAX_INPUT_BYTES, ReadOptions, decode, detect_format, read_node_text

__all__ = ["MAX_INPUT_BYTES", "ReadOptions", "decode", "detect_format", "read_node_text", "read_source", "read_text"]

_TEMPLATE_KEYS = re.compile(r"^gpu_count\s*:", re.M)


def read_text(text: str, options: ReadOptions | None = None, base_dir: Path | None = None) -> Topology:
    """Any textual source -> Topology; everything it cannot read is a `ParseError`."""
    try:
        return _read_text(text, options, base_dir)
    except ValueError as err:  # model invariants (a < b, lanes > 0, ...) broken by the input
        raise ParseError(str(err)) from None


def _read_text(text: str, options: ReadOptions | None, base_dir: Path | None) -> Topology:
    fmt = detect_format(text)
    if fmt == "cluster-spec" and _TEMPLATE_KEYS.search(text):  # a machine template file: one node of it
        from topology.templates import node_from_machine, parse_template

        machine = parse_template(text, "machine template")
        return Topology(nodes=(node_from_machine(machine, (options or ReadOptions()).node_name),))
    if fmt == "cluster-spec":
        from topology.readers.spec import parse_spec

        return parse_spec(text, base_dir=base_dir)
    if fmt == "json":
        from topology.serialize import loads

        return loads(text)
    return Topology(nodes=(read_node_text(text, options),))


def read_source(source: str, options: ReadOptions | None = None) -> Topology:
    """Any source -> Topology; `ParseError` with one clear line when it cannot."""
    options = options or ReadOptions()
    if source == "nvml":
        from topology.readers.nvml import discover

        return Topology(nodes=(discover(node_name=options.node_name),))
    path = Path(source)
    if path.is_file():
        try:
            data = path.read_bytes()
        except OSError as err:
            raise ParseError(f"cannot read: {err.strerror}", source) from None
        try:
            return read_text(decode(data, source), options, base_dir=path.parent)
        except ParseError as err:
            if err.source is None:
                raise ParseError(str(err), source) from None
            raise
    if path.is_dir():
        raise ParseError("is a directory, not a topology", source)
    from topology.templates import node_from_template, template_names

    if source in template_names():
        node = node_from_template(source, options.node_name)
        return Topology(nodes=(replace(node, name=options.node_name),))
    raise ParseError(
        "no such file, and not a machine template (templates: " + ", ".join(template_names()) + ")", source
    )
