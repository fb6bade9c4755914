"""What the servers on a measured path spend on the prompt's text before its first token: how
many of them tokenize it one after another (`tokenizations`, read from a point's `tokenized`) and
what each costs a token (`SERVER_PROMPT_US`). A TTFT the client measures pays it
(`loadtest.fidelity.predict`); the product's simulated engines take token counts and never do."""

from __future__ import annotations

from typing import Any

SERVER_PROMPT_US = 1.5
"""What an OpenAI-compatible server spends on each prompt token it receives as text before its
engine can start the prefill: the tokenizer (a Hugging Face fast BPE on one host thread) and the
engine's per-block prefix hashes. Published tokenizer timings of long prompts on server hosts:
"DGX H100's CPU can do about only about 1k tokens/ms" (vllm-project/vllm issue 19012, 2025-06-02,
a repeated word, which the tokenizer's word cache favours: a lower bound); vLLM-style random-dataset
text 1.3 us a token (ROCm/ATOM PR 1907, 2,000 prompts of 1,024 tokens, "the final encode | 2.71
s"); "70k-250k tokens: tokenize grows to 100-320ms", 1.3-1.4 (sgl-project/sglang PR 31345,
2026-07-15); "Qwen3 tokenizer: 64K random text, 200 ms", 3.1 on a host not stated (sglang PR
12768). Plus the SHA-256 block hashes a KV connector or prefix cache computes, "about 100-200ns per
token" (vLLM docs/design/prefix_caching.md, PR 29261). Fixed, not fitted: the middle of the
random-text measurements plus the hashes; no published point times it apart from the rest."""


def tokenizations(p: dict[str, Any]) -> int:
    """How many servers on the measured path tokenize the prompt one after another before its
    first token (`tokenized`, written next to the points whose source says; each adds
    `SERVER_PROMPT_US` a prompt token). Unstated: 0, except a disaggregated TTFT, whose prompt
    goes as text to its prefill server and, behind vLLM's proxy, to its decode server after the
    prefill returns (vllm-project/vllm tests/v1/kv_connector/nixl_integration/toy_proxy_server.py
    @030ea52effcb05071543c8c42b8f0145e94cee43, `_handle_completions`: the same `messages` to both,
    in series), so 2 there and 1 elsewhere (SGLang's PD router sends to both at once). A client that
    sends token ids (`sglang.bench_serving --tokenize-prompt`, C++ benchmarks) makes it 0."""
    stated = p.get("tokenized")
    if stated is not None:
        if isinstance(stated, bool) or not isinstance(stated, int) or stated < 0:
            raise ValueError(f"tokenized is a count of servers (0, 1, 2 ...), not {stated!r}")
        return stated
    if p.get("kind") != "pd-ttft":
        return 0
    return 2 if "vllm" in str(p.get("framework") or "").lower() else 1


def prompt_text_ms(p: dict[str, Any], tokens: int) -> float:
    """The servers' text handling of a `tokens`-token prompt on the measured path (`tokenizations`)."""
    return tokenizations(p) * SERVER_PROMPT_US * tokens / 1e3
