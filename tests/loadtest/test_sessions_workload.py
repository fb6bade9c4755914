"""Multi-turn sessions (`workload: {sessions: ...}`): what a user of the load tester relies on —
every turn resends the conversation, so a turn shares with the next exactly its system prompt and
history, sessions of one system prompt share it, and the live text carries the same sharing."""

from __future__ import annotations

import itertools

import pytest

from loadtest.workload import load_workload
from loadtest.workloads import WorkloadError
from loadtest.workloads.prompts import prompt_text
from loadtest.workloads.sessions import SessionsSpec, generate
from loadtest.workloads.synthetic import length_dist

pytestmark = pytest.mark.unit


def _sessions(**over: object) -> list:  # type: ignore[type-arg]
    spec = {"rate": 1.0, "turns": length_dist(4, "t"), "system": length_dist(640, "s"),
            "message": length_dist(300, "m"), "output": length_dist(100, "o"), "systems": 2, **over}
    return generate(SessionsSpec(**spec), seed=3, duration_s=30)  # type: ignore[arg-type]


def _shared(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def test_each_turn_resends_the_conversation_and_shares_it_with_the_next() -> None:
    reqs = _sessions(think_s=0.0)
    first = sorted((r for r in reqs if r.prefix_blocks[10] >= 1 << 16 and r.prefix_blocks[10] < 2 << 16),
                   key=lambda r: r.arrival_s)  # session 0's turns (its own blocks are 1 << 16 on)
    assert [r.prompt_tokens for r in first] == [640 + 300 + k * 400 for k in range(4)]
    for a, b in itertools.pairwise(first):
        assert b.arrival_s > a.arrival_s
        shared = _shared(a.prefix_blocks, b.prefix_blocks)
        assert shared == len(a.prefix_blocks)  # everything the earlier turn sent in full blocks
        assert shared * 64 >= a.prompt_tokens - 64
    systems = {r.prefix_blocks[:10] for r in reqs}
    assert 1 <= len(systems) <= 2  # sessions of one system prompt share its 10 blocks


def test_the_live_text_shares_exactly_what_the_blocks_share() -> None:
    reqs = sorted(_sessions(think_s=0.0, systems=1), key=lambda r: r.arrival_s)
    a = next(r for r in reqs)
    b = next(r for r in reqs if r.prefix_blocks[:len(a.prefix_blocks)] == a.prefix_blocks and r is not a)
    ta, tb = prompt_text(a, "t"), prompt_text(b, "t")
    common = len(a.prefix_blocks) * 64 * 4
    assert ta[:common - 8] == tb[:common - 8]
    other = next(r for r in reqs if r.prefix_blocks[10:11] != a.prefix_blocks[10:11])
    assert prompt_text(other, "t")[:640 * 4] == ta[:640 * 4]  # the shared system prompt
    assert prompt_text(other, "t")[640 * 4:640 * 4 + 256] != ta[640 * 4:640 * 4 + 256]


def test_agentic_sessions_come_back_fast_with_tool_results() -> None:
    chat = load_workload({"sessions": {"rate": 1, "sessions": 20}, "seed": 1})
    agent = load_workload({"sessions": {"rate": 1, "sessions": 20, "agentic": True}, "seed": 1})
    assert chat.source == "sessions" and agent.name == "agentic"
    assert agent.record()["prompt_tokens_mean"] > chat.record()["prompt_tokens_mean"]
    assert agent.span_s < chat.span_s  # think times of a machine, not a person
    scaled = load_workload({"sessions": {"rate": 1, "sessions": 20}, "seed": 1, "rate_scale": 2})
    assert len(scaled) == 2 * len(chat)


@pytest.mark.parametrize(("spec", "words"), [
    ({"sessions": {"rate": 0}}, "greater than 0"),
    ({"sessions": {"rate": 1, "turns": "uniform:5:2"}}, "above high"),
    ({"sessions": {"rate": 1}}, "need a bound"),
    ({"sessions": {"rate": 1, "sessions": 2}, "trace": "azure-conv"}, "exactly one of"),
])
def test_bad_sessions_specs_say_what_is_wrong(spec: dict[str, object], words: str) -> None:
    with pytest.raises((WorkloadError, ValueError), match=words):
        load_workload(spec)
