"""vLLM 0.32's request models for /v1/chat/completions and /v1/completions, as the simulated
engine reads them: `ChatCompletionRequest` (vllm/entrypoints/openai/chat_completion/protocol.py)
and `CompletionRequest` (vllm/entrypoints/openai/completion/protocol.py), their model validators,
then the checks the server and `SamplingParams._verify_args` (vllm/sampling_params.py) make, in
vLLM's order: model validators (BadRequestError), field types (Bad Request, every error at
once), then the sampling parameters. Unknown fields are accepted and ignored (OpenAIBaseModel:
extra="allow"). The model and the context length are checked by the server (`limits`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from simengine import toolcall
from wire.errors import ApiError
from wire.fields import VALIDATION, Body, Errors, over_max_model_len, prompt_over_context, vllm_error
from wire.openai import INT64, MAX_LOGPROBS, MAX_STOP_STRINGS
from wire.prompt import Prompt, chat_prompt, completion_prompts

MAX_N = 16384
"""VLLM_MAX_N_SEQUENCES."""
MAX_COMPLETION_PROMPTS = 1024
"""VLLM_MAX_COMPLETION_PROMPTS."""
JSON = dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class Sampling:
    """What SamplingParams holds that the simulated model honours."""

    n: int = 1
    max_tokens: int | None = None
    """As asked (max_completion_tokens, then max_tokens); None: up to the context."""
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: int | None = None
    """Alternatives per token (chat: top_logprobs when logprobs is true), None: no logprobs."""
    seed: int | None = None
    temperature: float = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineRequest:
    kind: str
    """'chat' or 'completion'."""
    model: str | None
    prompts: tuple[Prompt, ...]
    sampling: Sampling
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    priority: int = 0
    request_id: str | None = None
    kv_transfer_params: JSON | None = None
    response_format: tuple[str, JSON | None] | None = None
    """("json_object", None) or ("json_schema", schema), None: text."""
    tools: list[JSON] = field(default_factory=list)
    tool_choice: Any = "none"
    """"none", "auto", "required" or {"name": ...}."""
    last_role: str | None = None
    max_tokens_param: str = "max_tokens"

    @property
    def sequences(self) -> int:
        return len(self.prompts) * self.sampling.n


def _before(body: JSON, kind: str) -> Any:
    """The model validators that run before the field types (mode="before"): VLLMValidationError."""
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise vllm_error("Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt")
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and fmt.get("json_schema") is None:
        raise vllm_error("When response_format type is 'json_schema', the 'json_schema' field must be provided.",
                         "response_format")
    if body.get("stream_options") and not body.get("stream"):
        raise vllm_error("Stream options can only be defined when `stream=True`.", "stream_options")
    for name in ("prompt_logprobs", "top_logprobs" if kind == "chat" else "logprobs"):
        value = body.get(name)
        if value is not None and not isinstance(value, (int, float)):
            raise vllm_error(f"`{name}` must be an integer.", name, value)
        if value is not None and value < 0 and value != -1:
            raise vllm_error(f"`{name}` must be a positive value or -1.", name, value)
    if body.get("prompt_logprobs") and body.get("stream"):
        raise vllm_error("`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs")
    if kind == "completion":
        prompt = body.get("prompt")
        if prompt is None or prompt == "":
            raise vllm_error("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")
        if isinstance(prompt, list) and not all(isinstance(p, int) for p in prompt) \
                and len(prompt) > MAX_COMPLETION_PROMPTS:
            raise vllm_error(f"prompt list length {len(prompt)} exceeds the maximum allowed count of "
                             f"{MAX_COMPLETION_PROMPTS}. To increase this limit, set the "
                             "VLLM_MAX_COMPLETION_PROMPTS environment variable.", "prompt")
        return "none"
    top = body.get("top_logprobs")
    if top is not None and (top == -1 or top > 0) and not body.get("logprobs"):
        raise vllm_error("when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs")
    if body.get("continue_final_message") and body.get("add_generation_prompt"):
        raise vllm_error("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
    return toolcall.check_tool_usage(body)


def _response_format(fmt: Any, errors: Errors) -> tuple[str, JSON | None] | None:
    if fmt is None:
        return None
    where = "body.response_format.ResponseFormat"
    if not isinstance(fmt, dict):
        errors.add("model_type", "body.response_format", "Input should be a valid dictionary", fmt)
        return None
    kind = fmt.get("type")
    if kind in ("text", "structural_tag"):
        return None
    if kind == "json_object":
        return ("json_object", None)
    if kind != "json_schema":
        errors.add("literal_error", f"{where}.type", "Input should be 'text', 'json_object' or 'json_schema'", kind)
        return None
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        errors.add("missing", f"{where}.json_schema.name", "Field required", spec)
        return None
    schema = spec.get("schema")
    if schema is not None and not isinstance(schema, dict):
        errors.add("dict_type", f"{where}.json_schema.schema", "Input should be a valid dictionary", schema)
        return None
    return ("json_schema", schema) if schema is not None else ("json_object", None)


def _prompts(body: JSON, kind: str) -> tuple[tuple[Prompt, ...], str | None]:
    """The prompts (prompt.py reads them, for the router too), its errors in the pydantic shape."""
    try:
        if kind == "chat":
            messages = body.get("messages")
            last = messages[-1] if isinstance(messages, list) and messages else None
            role = last.get("role") if isinstance(last, dict) else None
            return (chat_prompt(messages, body.get("tools")),), role if isinstance(role, str) else None
        return completion_prompts(body.get("prompt")), None
    except ApiError as err:
        raise ApiError(400, err.message, VALIDATION, f"body.{err.param or 'messages'}") from None


def _sampling(b: Body, kind: str, seed: int | None) -> Sampling:
    """The sampling fields, typed (errors collected in `b.errors`)."""
    b.flag("echo", nullable=True)
    if kind == "chat":
        logprobs = b.integer("top_logprobs", 0) if b.flag("logprobs", False, nullable=True) else None
        n = b.integer("n", 1)
        max_tokens = b.integer("max_completion_tokens")
        if max_tokens is None:
            max_tokens = b.integer("max_tokens")
    else:
        logprobs = b.integer("logprobs")
        n = b.integer("n", 1, nullable=False)
        max_tokens = b.integer("max_tokens", 16)
    for name in ("frequency_penalty", "presence_penalty", "top_p", "min_p", "repetition_penalty"):
        b.number(name)
    b.integer("top_k")
    b.text("user")
    b.mapping("logit_bias")
    b.str_list("bad_words")
    b.flag("use_beam_search")
    b.flag("skip_special_tokens", True)
    stop = b.stop(MAX_STOP_STRINGS)
    min_tokens = b.integer("min_tokens", 0, nullable=False) or 0
    return Sampling(n=1 if n is None else n, max_tokens=max_tokens, min_tokens=min_tokens,
                    stop=tuple(stop), stop_token_ids=tuple(b.int_list("stop_token_ids")),
                    include_stop_str_in_output=b.flag("include_stop_str_in_output"),
                    ignore_eos=b.flag("ignore_eos"), logprobs=logprobs, seed=seed,
                    temperature=1.0 if (t := b.number("temperature")) is None else t)


def _verify(body: JSON, s: Sampling, max_tokens: int) -> None:
    """SamplingParams._verify_args and ._validate_logprobs (vllm/sampling_params.py), in their order."""
    if s.n < 1:
        raise vllm_error(f"n must be at least 1, got {s.n}.")
    if s.n > MAX_N:
        raise vllm_error(f"n must be at most {MAX_N}, got {s.n}. To increase this limit, set the "
                         "VLLM_MAX_N_SEQUENCES environment variable.")
    for name in ("presence_penalty", "frequency_penalty"):
        value = float(body.get(name) or 0.0)
        if not -2.0 <= value <= 2.0:
            raise vllm_error(f"{name} must be in [-2, 2], got {value}.")
    penalty = float(body.get("repetition_penalty") or 1.0)
    if not math.isfinite(penalty) or penalty <= 0.0:
        raise vllm_error(f"repetition_penalty must be greater than zero, got {penalty}.")
    t = s.temperature
    if t < 0.0:
        raise vllm_error(f"temperature must be non-negative, got {t}.", "temperature", t)
    if t > 2.0:
        raise vllm_error(f"temperature must be in [0, 2], got {t}.", "temperature", t)
    top_p = float(body["top_p"]) if body.get("top_p") is not None else 1.0
    if not 0.0 < top_p <= 1.0:
        raise vllm_error(f"top_p must be in (0, 1], got {top_p}.", "top_p", top_p)
    top_k = int(body.get("top_k") or 0)
    if top_k < -1:
        raise vllm_error(f"top_k must be 0 (disable), or at least 1, got {top_k}.")
    min_p = float(body.get("min_p") or 0.0)
    if not 0.0 <= min_p <= 1.0:
        raise vllm_error(f"min_p must be in [0, 1], got {min_p}.")
    if max_tokens < 1:
        raise vllm_error(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", max_tokens)
    if s.min_tokens < 0:
        raise vllm_error(f"min_tokens must be greater than or equal to 0, got {s.min_tokens}.")
    if s.min_tokens > max_tokens:
        raise vllm_error(f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {s.min_tokens}.")
    if any(not stop for stop in s.stop):
        raise vllm_error("stop cannot contain an empty string.")
    if t < 1e-5 and s.n > 1:
        raise vllm_error(f"n must be 1 when using greedy sampling, got {s.n}.")
    if s.logprobs is not None and (s.logprobs == -1 or s.logprobs > MAX_LOGPROBS):
        from simengine.tokens import VOCAB_SIZE

        asked = VOCAB_SIZE if s.logprobs == -1 else s.logprobs
        raise vllm_error(f"Requested sample logprobs of {asked}, which is greater than max allowed: {MAX_LOGPROBS}",
                         "logprobs", asked)


def read(body: JSON, kind: str) -> EngineRequest:
    """A generation request body, checked as vLLM checks it (the module docstring says the order)."""
    choice = _before(body, kind)
    b = Body(body)
    model = b.text("model")
    seed = b.integer("seed", bounds=INT64)
    sampling = _sampling(b, kind, seed)
    stream = b.flag("stream", False, nullable=True)
    options = b.mapping("stream_options") or {}
    priority = b.integer("priority", 0, nullable=False) or 0
    request_id = b.text("request_id", nullable=False)
    params = b.mapping("kv_transfer_params")
    fmt = _response_format(body.get("response_format"), b.errors)
    tools = toolcall.read_tools(body.get("tools"), b.errors) if kind == "chat" else []
    b.errors.raise_any()
    prompts, last_role = _prompts(body, kind)
    return EngineRequest(kind=kind, model=model, prompts=prompts, sampling=sampling, stream=stream,
                         include_usage=bool(options.get("include_usage")),
                         continuous_usage=bool(options.get("continuous_usage_stats")), priority=priority,
                         request_id=request_id, kv_transfer_params=params, response_format=fmt, tools=tools,
                         tool_choice=choice if kind == "chat" else "none", last_role=last_role,
                         max_tokens_param="max_completion_tokens" if kind == "chat" and body.get(
                             "max_completion_tokens") is not None else "max_tokens")


@dataclass(frozen=True, slots=True)
class Limits:
    """The served model and its context (`max_model_len`)."""

    model: str
    max_model_len: int
    source: str = ""
    """The model the engine loaded (vLLM's `--model`, its `model_config.model`; default `model`).
    Every catalogue model is text-only: a prompt with an image, audio or video part is refused."""


def not_multimodal(limits: Limits) -> ApiError:
    """vLLM's answer to a media part for a text-only model: `MultiModalRegistry.create_processor`
    raises ValueError("<model> is not a multimodal model"), which the server answers as 400
    BadRequestError without a param (vllm/multimodal/registry.py, error_response.py)."""
    return ApiError(400, f"{limits.source or limits.model} is not a multimodal model", "BadRequestError")


def check(req: EngineRequest, body: JSON, limits: Limits, setup: toolcall.ToolSetup,
          adapter: bool = False) -> list[int]:
    """What the server checks once the body is read, in vLLM's order: the model (`_check_model`,
    vllm/entrypoints/serve/engine/serving.py: 404, no model meaning the served one), the tool
    setup (`render_chat`), media parts (`not_multimodal`), the context (TokenizeParams,
    vllm/renderers/params.py), then the sampling parameters. Returns each prompt's max_tokens (`get_max_tokens`,
    vllm/entrypoints/serve/utils/api_utils.py: what was asked, at most the context left after
    the prompt; the context left when nothing was asked). `adapter`: the model named is a loaded
    LoRA adapter (`simengine.lora`)."""
    if req.model and req.model != limits.model and not adapter:
        raise ApiError(404, f"The model `{req.model}` does not exist. Valid aliases: {limits.model}.", "NotFoundError",
                       "model")
    toolcall.check_setup(req.tool_choice, setup)
    if any(p.media for p in req.prompts):
        raise not_multimodal(limits)
    asked, total, param = req.sampling.max_tokens, limits.max_model_len, req.max_tokens_param
    if asked is not None and asked > total:
        raise over_max_model_len(param, asked, total)
    out = []
    for prompt in req.prompts:
        if prompt.tokens > total:
            raise prompt_over_context(prompt.tokens, total)
        out.append(total - prompt.tokens if asked is None else min(asked, total - prompt.tokens))
    for n in out:
        _verify(body, req.sampling, n)
    return out
