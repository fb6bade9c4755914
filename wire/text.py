"""Deterministic generated text and token counts.

Token counts use a documented estimate, not a tokenizer: one token per 4 bytes of UTF-8 text
(OpenAI's rule of thumb for English), at least one. Generated text is one vocabulary word per
token, drawn from a generator seeded by the request's `seed` (or its id), so the same request
with the same seed gives the same text, and `completion_tokens` equals the words generated.
"""

from __future__ import annotations

import hashlib
import math
import random

BYTES_PER_TOKEN = 4
_WORDS = """
the of and to in a is that for it as was with be by on not he this are or his from at which but have
an they you were her she there been one all we their has would when if so no will more can out up
about into them some could time only new these two may first then do any like other my now over such
our man me even most made after also did many before must through back years where much your way
well down should because each just those people how too little state good very make world still own
see men work long get here between both life being under never day same another know while last
might us great old year off come since against go came right used take three island link route token
cache switch fabric tensor replica prefill decode latency bandwidth
"""
VOCAB = tuple(_WORDS.split())


PIECE_BASE = len(VOCAB) + 2
"""The simulated model's first text-piece id (after its words, end of sequence and media:
`simengine.tokens`): piece n of a text is PIECE_BASE + its 4 bytes, big-endian."""


def piece_ids(text: str) -> list[int]:
    """A text as the simulated model reads it: its 4-byte UTF-8 pieces as token ids (one for an
    empty text). The engine keys its prefix cache on them, and a router indexing its blocks
    computes the same ids from the same prompt (`wire.prompt.Prompt.key`)."""
    data = text.encode("utf-8")
    if not data:
        return [PIECE_BASE]
    return [PIECE_BASE + int.from_bytes(data[k:k + BYTES_PER_TOKEN].ljust(BYTES_PER_TOKEN, b"\0"), "big")
            for k in range(0, len(data), BYTES_PER_TOKEN)]


def count_tokens(text: str) -> int:
    return max(1, math.ceil(len(text.encode("utf-8")) / BYTES_PER_TOKEN))


def seed_for(request_seed: int | None, request_id: str) -> int:
    if request_seed is not None:
        return request_seed
    return int.from_bytes(hashlib.sha256(request_id.encode()).digest()[:8], "big")


class TokenText:
    """The words of one response, reproducible from the seed."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def next(self) -> str:
        return " " + self._rng.choice(VOCAB)
