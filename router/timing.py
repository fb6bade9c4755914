"""What the router reads off an engine's answer to time it, without parsing it: the SSE chunks
that carry output tokens (for ITL per token gap), and the timing a non-streamed answer reports
about itself (for its TTFT and TPOT). Pure functions of bytes."""

from __future__ import annotations

import orjson

TOKEN_MARKS = (b'"content":"', b'"text":"', b'"reasoning_content":"', b'"reasoning":"', b'"tool_calls":[{',
               b'"type":"response.output_text.delta"', b'"type":"response.function_call_arguments.delta"')
EMPTY_MARKS = (b'"content":""', b'"text":""', b'"reasoning_content":""', b'"reasoning":""',
               b'"type":"response.output_text.done"', b'"type":"response.content_part.done"',
               b'"status":"completed","type":"message"')
"""A Responses API stream (`/v1/responses`) carries its tokens in `response.output_text.delta`
and `response.function_call_arguments.delta` events (`"delta":"..."`); its closing events repeat
a message's whole text once each (`"text":"..."`: output_text.done, content_part.done, and the
completed message item in output_item.done and response.completed), which those marks take
back out."""
TAIL = max(len(m) for m in (*TOKEN_MARKS, *EMPTY_MARKS)) - 1


def token_events(tail: bytes, data: bytes) -> int:
    """The SSE chunks in `data` that carry output (text, reasoning or a tool call's delta), not
    a role-only first chunk, a finish-only last one, a usage chunk or [DONE]: tokens as the
    engine counts its gaps. `tail` is the end of the stream before `data` (shorter than any mark,
    so no mark is counted twice; one cut between two reads is counted once). Compact JSON, as
    vLLM (pydantic) and the simulated engine write it."""
    text = tail + data
    found = 0
    for mark in TOKEN_MARKS:
        found += text.count(mark)
    for mark in EMPTY_MARKS:
        found -= text.count(mark)
    return max(0, found)


def reported_timing(body: bytes) -> tuple[float, float, float] | None:
    """(TTFT, TPOT, engine's own span) in wall seconds from a non-streamed response's
    `isle_timing` (the simulated engine writes it, in its virtual ms and its `time_scale`),
    or None: an engine that says nothing (vLLM) leaves a non-streamed request without TTFT."""
    if b'"isle_timing"' not in body:
        return None
    try:
        timing = orjson.loads(body)["isle_timing"]
        scale = float(timing.get("time_scale", 1.0)) / 1000
        return float(timing["ttft_ms"]) * scale, float(timing["tpot_ms"]) * scale, float(timing["e2e_ms"]) * scale
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        return None
