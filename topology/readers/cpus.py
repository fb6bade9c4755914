"""CPU and NUMA lists: '0-55,112-167', hex masks as NCCL writes them, NUMA affinity lists."""

from __future__ import annotations

import re

_LIST = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")


def parse_cpu_list(text: str) -> list[int]:
    """'0-3,8' -> [0, 1, 2, 3, 8]; raises ValueError on anything else."""
    text = text.strip()
    if not _LIST.match(text):
        raise ValueError(f"not a CPU list: {text!r}")
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        start, end = int(lo), int(hi or lo)
        if end < start:
            raise ValueError(f"descending range in CPU list: {part!r}")
        out.extend(range(start, end + 1))
    return out


def format_cpu_list(cpus: list[int]) -> str:
    """[0, 1, 2, 3, 8] -> '0-3,8'."""
    parts: list[str] = []
    ordered = sorted(set(cpus))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def mask_to_cpu_list(mask: str) -> str:
    """NCCL/sysfs mask '0000ffff,ffffffff' (comma-separated 32-bit words, high first)."""
    digits = mask.replace(",", "").strip()
    if not digits or not re.fullmatch(r"[0-9a-fA-F]+", digits):
        raise ValueError(f"not a CPU mask: {mask!r}")
    value = int(digits, 16)
    return format_cpu_list([bit for bit in range(value.bit_length()) if value >> bit & 1])


def words_to_cpu_list(words: list[int], word_bits: int = 64) -> str:
    """NVML affinity arrays: word 0 holds CPUs 0..63."""
    cpus = [w * word_bits + b for w, word in enumerate(words) for b in range(word_bits) if word >> b & 1]
    return format_cpu_list(cpus)


def numa_node_of(text: str | None) -> int | None:
    """NUMA Affinity cell -> the GPU's (first) NUMA node; None for N/A, -1 or missing.

    The cell may be one number, or a list when the GPU is close to several NUMA nodes
    (GB200 prints e.g. '0,3-9,11-17'): the first node listed is the CPU socket's.
    """
    if text is None:
        return None
    text = text.strip()
    if text.upper() in ("N/A", "NA", "-1", ""):
        return None
    try:
        nodes = parse_cpu_list(text)
    except ValueError:
        return None
    return nodes[0] if nodes else None
