"""Multi-turn sessions: chats and agents whose every turn sends the whole conversation again, so
that each request's prompt is a shared system prompt, then that session's history, then the new
message — the traffic prefix caches exist for.

A session starts (Poisson, `rate` sessions a second), picks one of `systems` system prompts
(Zipf with exponent `system_skew` over them: a few agents or products serve most sessions;
their lengths are rounded up to whole blocks) and
runs `turns` turns. Turn k's prompt is the system prompt, the session's history (each earlier
turn's message and reply) and its own message (`message` tokens: a user's message, or with
`agentic` a tool's result), and asks for `output` tokens. The next turn arrives `think_s`
(exponential mean) after the previous one plus the time its reply takes at `reply_tok_s` tokens
a second (open loop: the generator does not wait for the server). With `agentic`, messages are
tool results and think times are a machine's (the `think_s` given, typically well under a
second), as in a tool-calling loop.

Sharing is declared as Mooncake's traces do (`TraceRequest.prefix_blocks`, blocks of
`block_tokens`): system prompt s's blocks and session k's history blocks have ids of their own,
so two requests share exactly the full blocks of what they have in common. A reply enters the
history as text of its own (a simulated engine's outputs are made up, so the reply the next turn
quotes is new text to every cache, as a real reply re-tokenized may be).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from loadtest.model import TraceRequest
from loadtest.workloads import WorkloadError
from loadtest.workloads.synthetic import LengthDist

SYSTEM_IDS = 1 << 30
"""Block ids of system prompt s start at SYSTEM_IDS + s * SPAN; session k's at (k + 1) * SPAN."""
SPAN = 1 << 16


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionsSpec:
    rate: float
    """Sessions started per second."""
    turns: LengthDist
    system: LengthDist
    """Each system prompt's length (drawn once per system prompt)."""
    message: LengthDist
    output: LengthDist
    systems: int = 4
    system_skew: float = 1.0
    think_s: float = 5.0
    reply_tok_s: float = 50.0
    agentic: bool = False
    block_tokens: int = 64
    sessions: int | None = None

    def __post_init__(self) -> None:
        if not (self.rate > 0 and self.systems >= 1 and self.system_skew >= 0 and self.think_s >= 0
                and self.reply_tok_s > 0 and self.block_tokens >= 1):
            raise WorkloadError("workload spec: sessions: rate, reply_tok_s and block_tokens must be positive, "
                                "systems >= 1, system_skew and think_s >= 0")


def _blocks(first: int, tokens: int, size: int) -> list[int]:
    return [first + i for i in range(tokens // size)]


def generate(spec: SessionsSpec, seed: int, max_requests: int | None = None,
             duration_s: float | None = None) -> list[TraceRequest]:
    """Sessions until `spec.sessions` of them, or until one would start at or after
    `duration_s`, or until `max_requests` requests are made; turns past `duration_s` are dropped,
    and at most `max_requests` requests (the earliest) are kept. At least one bound is required."""
    if spec.sessions is None and duration_s is None and max_requests is None:
        raise WorkloadError("workload spec: sessions need a bound: sessions=N, duration_s or max_requests")
    rng = {part: random.Random(f"{seed}:{part}") for part in ("start", "system", "turns", "length", "think")}
    weights = [1.0 / (s + 1) ** spec.system_skew for s in range(spec.systems)]
    bs = spec.block_tokens
    systems = [-(-spec.system.sample(rng["system"]) // bs) * bs for _ in range(spec.systems)]  # whole blocks
    out: list[TraceRequest] = []
    at, k = 0.0, 0
    while (spec.sessions is None or k < spec.sessions) and (duration_s is None or at < duration_s) \
            and (max_requests is None or len(out) < max_requests):
        s = rng["system"].choices(range(spec.systems), weights)[0]
        system_blocks = _blocks(SYSTEM_IDS + s * SPAN, systems[s], bs)
        history = 0
        t = at
        for _ in range(spec.turns.sample(rng["turns"])):
            message, output = spec.message.sample(rng["length"]), spec.output.sample(rng["length"])
            if duration_s is None or t < duration_s:  # its full blocks: the next turn starts with them
                own = _blocks((k + 1) * SPAN, history + message, bs)
                out.append(TraceRequest(index=len(out), arrival_s=t, prompt_tokens=systems[s] + history + message,
                                        output_tokens=output, prefix_blocks=tuple(system_blocks + own),
                                        block_tokens=bs))
            history += message + output
            t += output / spec.reply_tok_s + (rng["think"].expovariate(1.0 / spec.think_s) if spec.think_s else 0.0)
        k += 1
        at += rng["start"].expovariate(spec.rate)
    out.sort(key=lambda r: r.arrival_s)
    return out[:max_requests] if max_requests is not None else out
