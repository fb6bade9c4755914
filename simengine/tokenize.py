"""`/tokenize` and `/detokenize` as vLLM 0.32 serves them (vllm/entrypoints/serve/tokenize/:
`TokenizeCompletionRequest` {model, prompt, add_special_tokens, return_token_strs} or
`TokenizeChatRequest` {model, messages, tools, ...} -> `TokenizeResponse` {count, max_model_len,
tokens, token_strs}; `DetokenizeRequest` {model, tokens} -> `DetokenizeResponse` {prompt}),
over the simulated tokenizer (`simengine.tokens`): `count` is what the engine charges for the
same prompt (`usage.prompt_tokens`). The simulated tokenizer has no BOS: `add_special_tokens`
changes nothing.
"""

from __future__ import annotations

from typing import Any

from simengine import tokens
from simengine.protocol import Limits
from wire.errors import ApiError
from wire.fields import VALIDATION, Body, Errors, vllm_error
from wire.prompt import chat_prompt

JSON = dict[str, Any]


def _model(b: Body, limits: Limits) -> None:
    model = b.text("model")
    b.errors.raise_any()
    if model and model != limits.model:
        raise ApiError(404, f"The model `{model}` does not exist. Valid aliases: {limits.model}.", "NotFoundError",
                       "model")


def tokenize(body: JSON, limits: Limits) -> JSON:
    b = Body(body)
    strs = b.flag("return_token_strs", False, nullable=True)
    b.flag("add_special_tokens", True)
    if "messages" in body:
        b.flag("add_generation_prompt", True)
        if body.get("continue_final_message") and body.get("add_generation_prompt"):
            raise vllm_error("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
        _model(b, limits)
        try:
            prompt = chat_prompt(body.get("messages"), body.get("tools"))
        except ApiError as err:
            raise ApiError(400, err.message, VALIDATION, "body.messages") from None
        ids = tokens.encode(prompt.text)
        ids += [tokens.MEDIA_ID] * (prompt.tokens - len(ids))  # image, audio and video parts
    else:
        text = b.text("prompt", nullable=False)
        if "prompt" not in body:
            b.errors.add("missing", "body.prompt", "Field required", body)
        _model(b, limits)
        ids = tokens.encode(text or "")
    return {"count": len(ids), "max_model_len": limits.max_model_len, "tokens": ids,
            "token_strs": [tokens.token_str(t) for t in ids] if strs else None}


def detokenize(body: JSON, limits: Limits) -> JSON:
    b = Body(body)
    errors: Errors = b.errors
    ids = b.int_list("tokens")
    if "tokens" not in body:
        errors.add("missing", "body.tokens", "Field required", body)
    for k, t in enumerate(ids):
        if t < 0:
            errors.add("greater_than_equal", f"body.tokens.{k}", "Input should be greater than or equal to 0", t)
    _model(b, limits)
    bad = tokens.out_of_vocab(ids)
    if bad:
        raise vllm_error(f"Token id {max(bad)} is out of vocabulary")
    return {"prompt": tokens.decode(ids)}
