"""Disaggregated prefill/decode through the router against two real vLLM CPU servers with
NixlConnector (UCX on loopback): the decode replica gets the prompt's KV from the prefill
replica (its metrics say so) and produces exactly the tokens of a non-disaggregated run."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from control.replicas.vllm.process import VllmProcess
from router.config import DEV_KEY
from tests.support.clients import openai_client
from tests.vllm.conftest import SERVED, Router, router_config, start_router

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
IGNORE_EOS = {"ignore_eos": True}
PROMPT = "".join(f"def handler_{i}(request, topology):\n    return route(request, island={i})\n" for i in range(18))


@pytest.fixture(scope="module")
def router(pair: dict[str, VllmProcess], log_dir: Path) -> Iterator[Router]:
    config = router_config([p.server for p in pair.values()], pd={"enabled": True, "min_prompt_tokens": 0})
    with start_router(config, log_dir) as r:
        yield r


def client(base_url: str) -> openai.OpenAI:
    return openai_client(base_url, DEV_KEY, timeout=120)


def metric(url: str, name: str, labels: str = "") -> float:
    """A vLLM counter's value (0 when absent)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    pattern = re.compile(rf"^{re.escape(name)}\{{[^}}]*{re.escape(labels)}[^}}]*\}} ([0-9.e+]+)$", re.M)
    return sum(float(v) for v in pattern.findall(text))


EXTERNAL = ("vllm:prompt_tokens_by_source_total", 'source="external_kv_transfer"')


def test_pd_completion_matches_the_colocated_run(router: Router, pair: dict[str, VllmProcess]) -> None:
    before = metric(pair["d1"].url, *EXTERNAL)
    raw = client(router.url).completions.with_raw_response.create(model=SERVED, prompt=PROMPT, max_tokens=16,
                                                                  extra_body=IGNORE_EOS, temperature=0.0, seed=0)
    pd = raw.parse()
    assert raw.headers["x-isle-prefill-replica"] == "p1" and raw.headers["x-isle-replica"] == "d1"
    assert pd.usage is not None and pd.usage.completion_tokens == 16
    moved = metric(pair["d1"].url, *EXTERNAL) - before
    assert moved >= pd.usage.prompt_tokens - 1 > 100  # the prompt's KV came over NIXL, not recomputed
    assert metric(pair["d1"].url, "vllm:nixl_num_failed_transfers_total") == 0
    # the same request whole on one engine (no kv_transfer_params): the same tokens
    colocated = client(f"{pair['p1'].url}/v1").completions.create(model=SERVED, prompt=PROMPT, max_tokens=16,
                                                                  extra_body=IGNORE_EOS, temperature=0.0, seed=0)
    assert pd.choices[0].text == colocated.choices[0].text


def test_pd_chat_stream_matches_the_colocated_run(router: Router, pair: dict[str, VllmProcess]) -> None:
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": PROMPT + "\nExplain the handlers."}]
    before = metric(pair["d1"].url, *EXTERNAL)
    chunks = list(client(router.url).chat.completions.create(
        model=SERVED, messages=messages, max_tokens=16, stream=True,
        stream_options={"include_usage": True}, extra_body=IGNORE_EOS, temperature=0.0, seed=0))
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 16
    assert metric(pair["d1"].url, *EXTERNAL) - before > 100
    colocated = client(f"{pair['d1'].url}/v1").chat.completions.create(
        model=SERVED, messages=messages, max_tokens=16, extra_body=IGNORE_EOS, temperature=0.0, seed=0)
    assert streamed == colocated.choices[0].message.content
