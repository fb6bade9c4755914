"""Every topology source behind one call: `read_source(SOURCE)` -> `Topology`.

SOURCE is a file (`nvidia-smi topo -m` text, `rocm-smi --showtopo` text, NCCL topology XML,
a cluster spec YAML, or a topology JSON written by this package), the name of a shipped
machine template (`hgx-h100`), or `nvml` for live discovery on this machine. The format is
detected from the content, never from the file name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from topology.errors import ParseError
from topology.gpus import gpu_facts
from topology.model import Node, Topology
from topology.readers.build import with_gpu_facts
from topology.readers.nccl import NcclHints, parse_nccl
from topology.readers.rocm import MARKER as ROCM_MARKER
from topology.readers.rocm import parse_rocm
from topology.readers.smi import parse_smi

MAX_INPUT_BYTES = 16 * 1024 * 1024
_SPEC_KEYS = re.compile(r"^(nodes|racks|fabric|cluster|name)\s*:", re.MULTILINE)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadOptions:
    node_name: str = "node0"
    gpu: str | None = None
    """GPU model for sources that do not name it (captures, NCCL files without device ids)."""
    pci_classes: Mapping[str, str] = field(default_factory=dict)


def detect_format(text: str) -> str:
    head = text.lstrip()
    if head.startswith("<"):
        return "nccl-xml"
    if ROCM_MARKER in text:
        return "rocm-smi"
    if head.startswith("{"):
        return "json"
    if _SPEC_KEYS.search(text) and "GPU0" not in text:
        return "cluster-spec"
    return "nvidia-smi"


_TEMPLATE_KEYS = re.compile(r"^gpu_count\s*:", re.M)


def decode(data: bytes, source: str) -> str:
    if not data.strip():
        raise ParseError("empty input, not a topology", source)
    if len(data) > MAX_INPUT_BYTES:
        raise ParseError(f"input is {len(data)} bytes, more than any topology ({MAX_INPUT_BYTES})", source)
    if b"\x00" in data:
        raise ParseError("binary data, not a topology", source)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ParseError("binary data (not UTF-8 text), not a topology", source) from None


def read_node_text(text: str, options: ReadOptions | None = None) -> Node:
    """One machine's capture (nvidia-smi, rocm-smi or NCCL XML) -> Node."""
    options = options or ReadOptions()
    fmt = detect_format(text)
    if fmt == "nccl-xml":
        hints = NcclHints(gpu=options.gpu, pci_classes=dict(options.pci_classes))
        return parse_nccl(text, options.node_name, hints)
    if fmt == "rocm-smi":
        node = parse_rocm(text, options.node_name)
    elif fmt == "nvidia-smi":
        node = parse_smi(text, options.node_name)
    else:
        raise ParseError(f"a {fmt} document describes a cluster, not one machine's capture")
    if options.gpu:
        facts = gpu_facts(options.gpu)
        node = with_gpu_facts(node, facts.name, facts.nvlink_generation, facts.pcie_generation, facts.memory_gb)
    return node


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
