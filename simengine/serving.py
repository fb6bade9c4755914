"""One generation request on the simulated engine: its choices (one sequence each in the batching
core, as vLLM makes n child requests per prompt), what each writes, and the response, whole or
streamed, as the choices' tokens arrive from the driver.

Choice k of prompt p (n choices per prompt) has index p x n + k, as vLLM's completions give it
(`completion_stream_generator`: `output.index + prompt_idx * num_choices`). Its seed is the
request's `seed` + k (vLLM's `ParentRequest._get_child_sampling_params`: each child its own
seed), or, without a seed, one drawn from the prompt (and `request_id`, and k): the same request
gives the same text. A choice writes words, or what guided decoding allows: a tool call
(`toolcall.plan`), or JSON for `response_format`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from simengine import guided, toolcall
from simengine.faults import Faults
from simengine.output import Output, Token
from simengine.protocol import EngineRequest
from simengine.responses import DONE, Choice, Chunks, full
from wire.responder import Responder
from wire.text import seed_for


@dataclass(slots=True, eq=False)
class Live:
    req: EngineRequest
    rid: str
    model: str
    choices: list[Choice]
    queue: asyncio.Queue[tuple[Choice, Token]] = field(default_factory=asyncio.Queue)
    kv_ms: float = 0.0
    created: int = field(default_factory=lambda: int(time.time()))


def choices_for(req: EngineRequest, rid: str, budgets: list[int], tools: toolcall.ToolSetup) -> list[Choice]:
    """The request's sequences: n per prompt, prompt-major."""
    n, seed = req.sampling.n, req.sampling.seed
    out = []
    for p, prompt in enumerate(req.prompts):
        for k in range(n):
            index = p * n + k
            key = prompt.key + str(req.request_id or "") + (f"#{k}" if k else "")
            s = seed_for(seed + k if seed is not None else None, key)
            plan = toolcall.plan(req.tools, req.tool_choice, tools, req.last_role, s)
            raw = plan.raw if plan is not None else guided.json_text(req.response_format[1], s) \
                if req.response_format is not None else None
            out.append(Choice(index=index, prompt=p, rid=rid if req.sequences == 1 else f"{rid}-{index}",
                              out=Output(s, req.sampling, budgets[p], raw), tool=plan,
                              prompt_tokens=prompt.tokens, max_tokens=budgets[p]))
    return out


async def _next(live: Live, faults: Faults) -> tuple[Choice, Token]:
    got = await live.queue.get()
    faults.maybe_crash()
    return got


async def whole(live: Live, response: Responder, extra: Callable[[Live], dict[str, Any]], faults: Faults) -> None:
    """A non-streamed response, once every choice has finished."""
    pending = len(live.choices)
    while pending:
        _, t = await _next(live, faults)
        pending -= t.finish is not None
    body = full(live.req, live.rid, live.created, live.model, live.choices, extra(live))
    response.send(200, orjson.dumps(body))


async def stream(live: Live, response: Responder, extra: Callable[[Live], dict[str, Any]], faults: Faults) -> None:
    """A streamed response: chunks as tokens come, then usage (when asked for) and [DONE]."""
    chunks = Chunks(live.req, live.rid, live.created, live.model)
    response.start_stream()
    pending, first = len(live.choices), chunks.chat
    while pending:
        c, t = await _next(live, faults)
        data = chunks.roles(live.choices) if first else b""
        first = False
        data += chunks.token(c, t)
        pending -= t.finish is not None
        if data:
            await response.write(data)
    tail = DONE
    if live.req.include_usage:
        tail = chunks.usage(live.choices, extra(live)) + DONE
    await response.write(tail)
    response.end()
