"""Token ids standing for a trace request's prompt in the offline simulator, so that the engines'
prefix caches (`kvblocks.cache`) and the router's view of them see exactly the sharing the trace
declares: each of its `prefix_blocks` ids is `block_tokens` tokens that depend only on the id
(the live driver's text does the same, `loadtest.workloads.prompts`), and the rest of the prompt
is the request's own."""

from __future__ import annotations

from loadtest.model import TraceRequest

SPAN = 1 << 20
"""Ids per block id (more than any block's tokens): block h's tokens are (h+1)·SPAN + i."""


def token_ids(tr: TraceRequest) -> tuple[int, ...]:
    n = tr.prompt_tokens
    out: list[int] = []
    for h in tr.prefix_blocks:
        if len(out) >= n:
            break
        base = (h + 1) * SPAN
        out.extend(range(base, base + min(tr.block_tokens, SPAN)))
    if len(out) < n:  # negative: never a block's
        base = -(tr.index + 1) * SPAN
        out.extend(range(base, base + n - len(out)))
    return tuple(out[:n])
