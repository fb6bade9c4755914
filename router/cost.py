"""What one generation request may cost, bounded before it is routed (issue 28, fair shares).

A request's cost is known from its body before any engine sees it: the sequences it starts
(n x prompts), the tokens those may process (each prompt plus max_tokens, per sequence), the
logprob entries it may return (per generated token 1 + top_logprobs, per prompt token
1 + prompt_logprobs) and the response bytes those make. Each has a limit (`CostLimits`, from
the router config's `fair` section); a request over one gets an OpenAI-shaped 400 naming it.

max_tokens when the client sends none: a chat request (and a completion with `max_tokens:
null`) would generate up to the model's context, which the router cannot bound; the router
sends `default_max_tokens` (the router's `max_tokens_limit` unless configured, at most the
model's max_model_len as its engines say) to the engine instead, and prices the request with
it. A completion without the field gets the API's 16.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from wire.errors import ApiError
from wire.fields import as_int
from wire.prompt import Prompt

COMPLETION_DEFAULT_MAX_TOKENS = 16
"""The legacy completions API's max_tokens when the field is absent (OpenAI's and vLLM's)."""
TOKEN_BYTES = 6
"""A generated token's text in a response: about 4 characters, some escaped."""
STREAM_CHUNK_BYTES = 160
"""A streamed token's SSE event around its text (id, model, choice, `data: ` framing)."""
LOGPROB_ENTRY_BYTES = 56
"""One logprob entry (`{"token": " the", "logprob": -0.1234, "bytes": [32, 116, 104, 101]}`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CostLimits:
    max_sequences: int = 64
    max_request_tokens: int = 1_048_576
    max_logprob_entries: int = 262_144
    max_response_bytes: int = 32 * 1024 * 1024
    default_max_tokens: int = 32768


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestCost:
    sequences: int
    max_tokens: int
    """Per sequence, as the engine will apply it (what was asked, or the default)."""
    tokens: int
    """Prompt plus max_tokens, summed over the sequences: the most the engines may process."""
    logprob_entries: int
    response_bytes: int
    defaulted: bool = False
    """The client sent no max_tokens: the router sends `max_tokens` (= this `max_tokens`)."""


def _n(body: dict[str, Any]) -> int:
    n = as_int(body.get("n"))  # 2.0 and "2" are two sequences to the engine, too
    return n if n is not None and n > 1 else 1


def _max_tokens(body: dict[str, Any], chat: bool, default: int, keys: tuple[str, ...] | None = None
                ) -> tuple[int, bool]:
    """The max_tokens the engine will apply, and whether the router must send it (none given).
    `keys`: the fields that hold it, first given wins (default: the chat's or completion's)."""
    for key in keys or (("max_completion_tokens", "max_tokens") if chat else ("max_tokens",)):
        value = body.get(key)
        if value is not None:  # given: the engine applies it, or refuses it ("ten", 1.5) with its own 400
            got = as_int(value)
            return (default if got is None else max(got, 0)), False
    if not chat and "max_tokens" not in body:
        return COMPLETION_DEFAULT_MAX_TOKENS, False
    return default, True


def _alternatives(body: dict[str, Any], chat: bool) -> int | None:
    """Logprob entries per generated token (1 + top_logprobs), None when none are asked for."""
    if chat:
        if body.get("logprobs") is not True:
            return None
        top = as_int(body.get("top_logprobs"))
    else:
        top = as_int(body.get("logprobs"))
        if top is None:
            return None
    return 1 + max(top or 0, 0)


def measure(body: dict[str, Any], prompts: Sequence[Prompt], *, chat: bool, stream: bool,
            default_max_tokens: int, token_keys: tuple[str, ...] | None = None) -> RequestCost:
    """`token_keys`: where the body's max_tokens is (the Responses API's `max_output_tokens`),
    default the chat's or the completion's fields."""
    sequences = _n(body) * len(prompts)
    max_tokens, defaulted = _max_tokens(body, chat, default_max_tokens, token_keys)
    prompt_tokens = sum(p.tokens for p in prompts)
    n = sequences // max(len(prompts), 1)
    tokens = n * prompt_tokens + sequences * max_tokens
    per_token = _alternatives(body, chat)
    entries = sequences * max_tokens * per_token if per_token is not None else 0
    prompt_k = as_int(body.get("prompt_logprobs"))
    if prompt_k is not None:
        entries += n * prompt_tokens * (1 + max(prompt_k, 0))
    text_bytes = sequences * max_tokens * (TOKEN_BYTES + (STREAM_CHUNK_BYTES if stream else 0))
    return RequestCost(sequences=sequences, max_tokens=max_tokens, tokens=tokens, logprob_entries=entries,
                       response_bytes=text_bytes + entries * LOGPROB_ENTRY_BYTES, defaulted=defaulted)


def _too_many(sequences: int, limits: CostLimits) -> ApiError:
    return ApiError(400, f"this request asks for {sequences} sequences (n x prompts), over this router's limit "
                              f"of {limits.max_sequences} per request", param="n", cause="sequences")


def check_sequences(body: dict[str, Any], limits: CostLimits) -> None:
    """The sequence bound from the prompt list's length alone, before any prompt is read (a list of
    strings or of token-id lists holds one prompt per entry; reading a million of them to count
    them would hold the router's event loop for seconds)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        sequences = _n(body) * len(prompt)
        if sequences > limits.max_sequences:
            raise _too_many(sequences, limits)


def check(cost: RequestCost, limits: CostLimits) -> None:
    """400 naming the first limit the request is over (cause: which one, for the rejection counts)."""
    if cost.sequences > limits.max_sequences:
        raise _too_many(cost.sequences, limits)
    if cost.tokens > limits.max_request_tokens:
        raise ApiError(400, f"this request may process {cost.tokens} tokens (n x prompts x (prompt + max_tokens "
                                 f"{cost.max_tokens})), over this router's limit of {limits.max_request_tokens} per "
                                 "request; lower n or max_tokens", param="max_tokens", cause="request_tokens")
    if cost.logprob_entries > limits.max_logprob_entries:
        raise ApiError(400, f"this request may return {cost.logprob_entries} logprob entries (sequences x "
                                 "tokens x (1 + top logprobs)), over this router's limit of "
                                 f"{limits.max_logprob_entries} per request; lower max_tokens or the logprobs asked",
                            param="logprobs", cause="logprobs")
    if cost.response_bytes > limits.max_response_bytes:
        raise ApiError(400, f"this request's response may reach {cost.response_bytes} bytes, over this "
                                 f"router's limit of {limits.max_response_bytes} per request; lower n or max_tokens",
                            param="max_tokens", cause="response_bytes")
