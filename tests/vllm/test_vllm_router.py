"""Two real vLLM servers on CPU, started by the launcher, behind the router: the official openai
client, chat and completions, streamed and not, and SLO classes forwarded as vLLM priorities."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from control.replicas.vllm.process import VllmProcess, free_port
from router.config import DEV_KEY
from tests.support.clients import openai_client
from tests.vllm.conftest import SERVED, Router, cpu_server, router_config, start_all, start_router, stop_all

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
IGNORE_EOS = {"ignore_eos": True}  # random weights may end a reply at once


@pytest.fixture(scope="module")
def mixed(log_dir: Path) -> Iterator[list[VllmProcess]]:
    procs = start_all([cpu_server("m1", "mixed", 0, free_port()), cpu_server("m2", "mixed", 1, free_port())], log_dir)
    try:
        yield procs
    finally:
        stop_all(procs)


@pytest.fixture(scope="module")
def router(mixed: list[VllmProcess], log_dir: Path) -> Iterator[Router]:
    with start_router(router_config([p.server for p in mixed]), log_dir) as r:
        yield r


def client(router: Router) -> openai.OpenAI:
    return openai_client(router.url, DEV_KEY, timeout=120)


def test_models_and_chat_through_the_router(router: Router) -> None:
    c = client(router)
    assert [m.id for m in c.models.list()] == [SERVED]
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say something about topology."}]
    raw = c.chat.completions.with_raw_response.create(model=SERVED, messages=messages,
                                                      max_tokens=12, extra_body=IGNORE_EOS, temperature=0.0, seed=0)
    chat = raw.parse()
    assert raw.headers["x-isle-replica"] in ("m1", "m2")
    assert chat.usage is not None and chat.usage.completion_tokens == 12
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content
    stream = c.chat.completions.create(model=SERVED, messages=messages, max_tokens=12,
                                       stream=True, stream_options={"include_usage": True}, extra_body=IGNORE_EOS,
                                       temperature=0.0, seed=0)
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
    assert text == chat.choices[0].message.content  # greedy: the same tokens, streamed or not


def test_completions_streamed_and_not(router: Router) -> None:
    c = client(router)
    whole = c.completions.create(model=SERVED, prompt="def route(request):", max_tokens=10, extra_body=IGNORE_EOS,
                                 temperature=0.0, seed=0)
    assert whole.usage is not None and whole.usage.prompt_tokens > 0 and whole.usage.completion_tokens == 10
    chunks = list(c.completions.create(model=SERVED, prompt="def route(request):", max_tokens=10, stream=True,
                                       stream_options={"include_usage": True}, extra_body=IGNORE_EOS,
                                       temperature=0.0, seed=0))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == whole.choices[0].text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 10


@pytest.mark.parametrize("slo_class", ["interactive", "standard", "batch"])
def test_every_slo_class_reaches_vllm_as_a_priority(router: Router, slo_class: str) -> None:
    """The router sets `priority` from the class; vLLM takes it because the launcher asks for
    --scheduling-policy priority (under fcfs it answers 400)."""
    out = client(router).completions.create(model=SERVED, prompt="x = 1", max_tokens=2,
                                            extra_headers={"x-slo-class": slo_class}, temperature=0.0, seed=0)
    assert out.usage is not None and out.usage.completion_tokens >= 1


def test_replicas_serve_and_stay_healthy(router: Router, mixed: list[VllmProcess]) -> None:
    c = client(router)
    served = {str(c.completions.with_raw_response.create(model=SERVED, prompt=f"n{i}", max_tokens=1, temperature=0.0,
                                                         seed=0).headers["x-isle-replica"]) for i in range(12)}
    assert served <= {"m1", "m2"} and served
    assert all(p.healthy() for p in mixed)
