"""A disaggregated TTFT as the measured engines run the prefill: chunked prefill at the engine's
token budget (vLLM's default by GPU), the chat template's tokens, and NVLS all-reduces only where
the engine lets NCCL use them."""

from __future__ import annotations

from typing import Any

import pytest

from loadtest.fidelity import predict, prompttext
from physics import queries as cost

pytestmark = pytest.mark.unit


def test_a_chunked_prefill_is_one_step_per_chunk_over_the_cache_before_it() -> None:
    steps = cost.chunk_steps(32776, 0, 8192)
    assert [s[0] for s in steps] == [(8192, 0), (8192, 8192), (8192, 16384), (8192, 24576), (8, 32768)]
    one = cost.prefill("qwen3-8b", "h800-sxm", 8, 32776)
    chunked = cost.prefill("qwen3-8b", "h800-sxm", 8, 32776, chunk=8192)
    assert one["steps"] == 1 and chunked["steps"] == 5
    # the same FLOPs and all-reduced bytes; every extra step reads the weights and launches again
    assert one["ms"] < chunked["ms"] < 1.2 * one["ms"]
    assert cost.prefill("qwen3-8b", "h800-sxm", 8, 4096, chunk=8192)["ms"] == pytest.approx(
        cost.prefill("qwen3-8b", "h800-sxm", 8, 4096)["ms"])
    with pytest.raises(ValueError):
        cost.prefill("qwen3-8b", "h800-sxm", 8, 4096, chunk=1024, sequences=2)


def test_all_reduces_without_nvls_run_rings_and_take_longer() -> None:
    nvls = cost.prefill("llama-3.1-70b", "h100-sxm", 8, 8192)["ms"]
    ring = cost.prefill("llama-3.1-70b", "h100-sxm", 8, 8192, nvls=False)["ms"]
    assert ring > nvls
    assert cost.prefill("llama-3.1-70b", "a100-sxm4", 8, 8192, nvls=False)["ms"] == pytest.approx(
        cost.prefill("llama-3.1-70b", "a100-sxm4", 8, 8192)["ms"])  # no NVLink SHARP on A100


def _point(**kw: Any) -> dict[str, Any]:
    return {"kind": "pd-ttft", "unit": "ms", "model": "qwen3-8b", "gpu": "h800", "tp": 8, "link": "rdma",
            "gbps": 200, "batch": 1, **kw}


def test_engine_budget_and_collectives_follow_the_engine() -> None:
    vllm = _point(framework="vLLM 0.11.2 + MooncakeConnector", tokens=32768)
    assert predict.engine_chunk(vllm, "h800-sxm") == 8192
    assert predict.engine_chunk(vllm, "a100-sxm4") == 2048  # vLLM keeps A100 at the small budget
    assert predict.engine_chunk({**vllm, "chunk": 0}, "h800-sxm") == 0
    sglang = _point(framework="SGLang main + Mooncake", tokens=2048)
    assert predict.engine_chunk(sglang, "h20") == 0 and not predict.engine_nvls(sglang)
    assert predict.engine_nvls(vllm)
    plain, why = predict.predict(vllm)
    templated, _ = predict.predict({**vllm, "template_tokens": 8})
    assert not why and plain is not None and templated is not None and templated > plain


def test_servers_that_tokenize_the_prompt_add_to_the_ttft_the_client_sees() -> None:
    """Behind vLLM's PD proxy the prefiller and then the decoder tokenize the text, one after the
    other; a client that sends token ids (SGLang's --tokenize-prompt) makes no server tokenize."""
    vllm = _point(framework="vLLM 0.11.2 + MooncakeConnector", tokens=32768)
    sglang = _point(framework="SGLang main + Mooncake", tokens=32768)
    assert prompttext.tokenizations(vllm) == 2 and prompttext.tokenizations(sglang) == 1
    assert prompttext.tokenizations({**sglang, "tokenized": 0}) == 0
    assert prompttext.tokenizations({"kind": "prefill", "framework": "vLLM"}) == 0  # unstated outside PD: none
    for bad in ("two", -1, 1.5, True):
        value, why = predict.predict({**vllm, "tokenized": bad})
        assert value is None and "tokenized is a count of servers" in why, bad
    text, _ = predict.predict(vllm)
    ids, _ = predict.predict({**vllm, "tokenized": 0})
    assert text is not None and ids is not None
    assert text - ids == pytest.approx(2 * prompttext.SERVER_PROMPT_US * 32768 / 1e3)  # ~98 ms at 32K


def test_mooncakes_vllm_pd_ttft_is_within_25_percent_held_out() -> None:
    """vLLM + Mooncake's Qwen3-8B TP8 on H800 (MOONCAKE-PD), predicted by constants fitted without
    it: the long prompts' TTFT carries the servers' tokenization and the TP-replicated norms, which
    the model priced at nothing before (0.67 and 0.60 at 8K and 32K)."""
    from loadtest.fidelity import fit as fitting
    from loadtest.fidelity import report as fidelity

    held, _ = fitting.cross_validate(fidelity.points(), predict.predict, only=["MOONCAKE-PD"])
    ratios = {h.id: h.ratio for h in held if h.kind == "pd-ttft" and h.ratio is not None}
    assert len(ratios) == 3 and all(0.75 <= r <= 1.25 for r in ratios.values()), ratios
