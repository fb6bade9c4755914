"""The text a `TraceRequest` is sent as: its prompt tokens long as the simulated engine and the
router read a one-message chat prompt (`wire.prompt`: 4 bytes a token, two more for the
`<|user|>` tag), so the engine sees the trace's prompt length. Real
tokenizers count this English-like filler at roughly the same rate.

Prefix sharing: a request's `prefix_blocks` become blocks of `block_tokens` tokens whose text
depends only on the block id (and the run's tag), so two requests that share their leading ids
share exactly that much leading text, and the router's prefix hash and an engine's prefix cache
see the sharing the trace has. A request without blocks starts with a marker of its own, so it
shares nothing. The tag keeps one run's text from hitting the cache a previous run left behind.
"""

from __future__ import annotations

import random

from loadtest.model import TraceRequest
from wire.text import BYTES_PER_TOKEN, VOCAB

CHAT_TAG_TOKENS = 2
"""Tokens the simulated engine counts for `<|user|>` around a one-message chat prompt."""


class _Filler:
    """One long, fixed run of vocabulary words, grown on demand and sliced."""

    def __init__(self) -> None:
        rng = random.Random(0)
        self.text = " ".join(rng.choice(VOCAB) for _ in range(2048)) + " "

    def take(self, n: int) -> str:
        while len(self.text) < n:
            self.text += self.text
        return self.text[:n]


_FILLER = _Filler()


def prompt_text(req: TraceRequest, tag: str = "") -> str:
    """ASCII text of `req.prompt_tokens` tokens (for a chat message, tag included)."""
    size = max(1, (req.prompt_tokens - CHAT_TAG_TOKENS) * BYTES_PER_TOKEN)
    block = req.block_tokens * BYTES_PER_TOKEN
    parts: list[str] = []
    used = 0
    for h in req.prefix_blocks:
        if used >= size:
            break
        marker = f"<{tag}:{h}> "
        parts.append(marker + _FILLER.take(max(0, block - len(marker))))
        used += block
    if used < size:
        marker = f"<{tag}:r{req.index}> "
        parts.append(marker + _FILLER.take(max(0, size - used - len(marker))))
    return "".join(parts)[:size]
