"""One machine's capture -> `Node`: the format detected from the content (never the file name),
the bytes checked before they are read as text, and the reader for that format.

The cluster-spec reader builds nodes from captures through this module, and `topology.readers`
re-exports it; it imports the per-format readers only, never the package above it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from topology.errors import ParseError
from topology.gpus import gpu_facts
from topology.model import Node
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
        node = with_gpu_facts(node, gpu_facts(options.gpu))
    return node
