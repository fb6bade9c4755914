"""Chained block keys: block i's key hashes block i-1's key, block i's tokens and the adapter, so
equal keys mean equal prefixes. 64-bit BLAKE2b: stable across processes and runs (unlike
Python's `hash`), cheap enough for the router's hot path."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

ROOT = 0
"""The key before a prompt's first block."""


def next_key(parent: int, tokens: Sequence[int], lora: str | None = None) -> int:
    h = hashlib.blake2b(digest_size=8)
    h.update(parent.to_bytes(8, "big"))
    h.update(struct.pack(f">{len(tokens)}q", *tokens))  # any id a tokenizer or the simulated model gives
    if lora:
        h.update(b"\x00lora\x00" + lora.encode())
    return int.from_bytes(h.digest(), "big")


def block_keys(tokens: Sequence[int], block_size: int, lora: str | None = None, parent: int = ROOT) -> list[int]:
    """The keys of `tokens`' full blocks (a partial last block has none, as in vLLM)."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    out = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = next_key(parent, tokens[start:start + block_size], lora)
        out.append(parent)
    return out
