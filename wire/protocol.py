"""The OpenAI API as vLLM 0.32 takes and answers it, as pydantic models: what the OpenAPI
document is generated from (as FastAPI generates vLLM's from its protocol models). Nothing
validates a request with them: the simulated engine reads bodies with vLLM's rules and error
messages (`simengine.protocol`), and the router reads only what routing needs. So each model
here says what the engine accepts, and no more: a body valid against a request model's JSON
schema is one the engine serves, and most bodies outside it are ones the engine refuses.

The request models keep OpenAIBaseModel's `extra="allow"` (unknown fields are ignored); they list
the fields the simulated engine honours, with vLLM's bounds, and state vLLM's cross-field model
validators as JSON Schema (`allOf` in each model's schema). Lists are bounded more tightly than
vLLM bounds them (stop strings aside), so that generated examples stay small; the field
descriptions give vLLM's own limits.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from wire.openai import INT64, MAX_LOGPROBS, MAX_STOP_STRINGS
from wire.prompt import MAX_TOKEN_ID

JSON = dict[str, Any]
MAX_N_DOCUMENTED = 16
"""The most choices per prompt the document lists (vLLM takes up to VLLM_MAX_N_SEQUENCES)."""
MAX_PROMPTS_DOCUMENTED = 8
MAX_PROMPT_IDS_DOCUMENTED = 4096
MAX_COMPLETION_LOGPROBS = 5
"""The legacy completions API's bound on `logprobs` (OpenAI's)."""

Absent = SkipJsonSchema[None]
"""`X | Absent = None`: a field that may be left out but is never null (the schema says only X)."""
TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]
Text = Annotated[str, Field(min_length=1)]


def requires(name: str, unless: JSON, then: JSON) -> JSON:
    """A cross-field rule as JSON Schema: `name`, when present and not `unless`, needs `then`."""
    return {"anyOf": [{"not": {"required": [name]}}, {"properties": {name: unless}}, then]}


def _rules(*rules: JSON) -> ConfigDict:
    return ConfigDict(extra="allow", use_attribute_docstrings=True, json_schema_extra={"allOf": list(rules)})


SAMPLING_RULES = (
    requires("temperature", {"minimum": 1e-5}, {"properties": {"n": {"maximum": 1}}}),
    requires("stream_options", {"type": ["object", "null"], "maxProperties": 0},
             {"required": ["stream"], "properties": {"stream": {"const": True}}}),
)
"""n > 1 needs a temperature above 1e-5 (greedy sampling has one answer: SamplingParams);
stream_options only with stream: true (the request models' validator)."""
CHAT_RULES = (
    requires("tools", {"type": ["array", "null"], "maxItems": 0}, {"required": ["tool_choice"]}),
    requires("top_logprobs", {"type": ["integer", "null"], "maximum": 0},
             {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}}),
)
"""Tools without tool_choice mean tool_choice auto, which needs a tool parser (vLLM:
--enable-auto-tool-choice --tool-call-parser); top_logprobs above 0 needs logprobs: true."""


class Base(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)


class TextPart(Base):
    type: Literal["text"]
    text: str


class ChatMessage(Base):
    """A message: vLLM takes every role and content part (tool messages, tool_calls, image and
    audio parts); the schema lists the plain ones."""

    role: Literal["system", "user", "assistant", "developer"]
    content: str | Annotated[list[TextPart], Field(min_length=1)]
    name: str | Absent = None


class StreamOptions(Base):
    include_usage: bool | None = True
    """A last chunk with the usage of every choice."""
    continuous_usage_stats: bool | None = False
    """The usage so far in every chunk."""


class FunctionParameters(Base):
    """The function's arguments as a JSON Schema object."""

    type: Literal["object"] | Absent = None


class FunctionDefinition(Base):
    name: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")]
    description: str | Absent = None
    parameters: FunctionParameters | Absent = None


class ChatCompletionTool(Base):
    type: Literal["function"]
    function: FunctionDefinition


class ResponseFormat(Base):
    """json_object: the answer is valid JSON (json_schema too, with its schema: not generated here)."""

    type: Literal["text", "json_object"]


MaxTokens = Annotated[int | None, Field(ge=1)]


class SamplingRequest(Base):
    """The fields vLLM's chat and completions requests share."""

    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)

    model: Text
    """A model the router serves (`GET /v1/models`)."""
    max_tokens: MaxTokens = None
    """Absent: up to the model's context (vLLM); with the prompt, at most the model's context
    (else 400, as vLLM)."""
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    """Only with stream: true (vLLM)."""
    temperature: Annotated[float | None, Field(ge=0, le=2)] = None
    top_p: Annotated[float | None, Field(gt=0, le=1)] = None
    seed: Annotated[int | None, Field(ge=INT64[0], le=INT64[1])] = None
    stop: Text | Annotated[list[Text], Field(max_length=MAX_STOP_STRINGS)] | None = None
    """Strings that end a choice (at most VLLM_MAX_STOP_STRINGS)."""
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    user: str | None = None


class ChatCompletionRequest(SamplingRequest):
    """vLLM 0.32's ChatCompletionRequest (its model validators and sampling checks apply): n > 1
    needs a temperature above 1e-5 (greedy sampling has one answer); stream_options only with
    stream: true; tools without tool_choice mean tool_choice auto, which needs a tool parser (vLLM:
    --enable-auto-tool-choice --tool-call-parser); top_logprobs above 0 needs logprobs: true."""

    model_config = _rules(*SAMPLING_RULES, *CHAT_RULES)

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: MaxTokens = None
    """As max_tokens (which it replaces)."""
    n: Annotated[int | None, Field(ge=1, le=MAX_N_DOCUMENTED)] = 1
    """Choices per prompt (vLLM: up to VLLM_MAX_N_SEQUENCES); several sequences are served whole
    by one replica, never split over PD."""
    logprobs: bool | None = False
    top_logprobs: Annotated[int | None, Field(ge=0, le=MAX_LOGPROBS)] = None
    """Alternatives per token, with logprobs: true (at most the engine's --max-logprobs)."""
    response_format: ResponseFormat | None = None
    tools: Annotated[list[ChatCompletionTool] | None, Field(min_length=1)] = None
    tool_choice: Literal["none"] | None = None
    """Also auto, required and a named function where the engine runs with a tool parser (vLLM:
    --tool-call-parser, and --enable-auto-tool-choice for auto); without one those are 400, as
    vLLM answers."""


class CompletionRequest(SamplingRequest):
    """vLLM 0.32's CompletionRequest (its model validators and sampling checks apply): n > 1 needs
    a temperature above 1e-5 (greedy sampling has one answer); stream_options only with stream:
    true."""

    model_config = _rules(*SAMPLING_RULES)

    prompt: (Text | Annotated[list[Text], Field(min_length=1, max_length=MAX_PROMPTS_DOCUMENTED)]
             | Annotated[list[TokenId], Field(min_length=1, max_length=MAX_PROMPT_IDS_DOCUMENTED)])
    """A string, a list of strings (a choice per prompt; vLLM takes up to
    VLLM_MAX_COMPLETION_PROMPTS), token ids; lists of token ids too."""
    n: Annotated[int, Field(ge=1, le=MAX_N_DOCUMENTED)] = 1
    """Choices per prompt (vLLM: up to VLLM_MAX_N_SEQUENCES); several sequences are served whole
    by one replica, never split over PD."""
    logprobs: Annotated[int | None, Field(ge=0, le=MAX_COMPLETION_LOGPROBS)] = None
    """Alternatives per token."""


class InputText(Base):
    type: Literal["input_text"]
    text: str


class ResponsesInputMessage(Base):
    """An input item: a message (vLLM also takes function_call and function_call_output items,
    images and files; the schema lists the plain ones)."""

    role: Literal["system", "user", "assistant", "developer"]
    content: str | Annotated[list[InputText], Field(min_length=1)]
    type: Literal["message"] | Absent = None


class ResponsesRequest(Base):
    """vLLM 0.32's ResponsesRequest (OpenAI's Responses API), the fields the simulated engine
    honours (it also takes function `tools` and `tool_choice`, called as the engine's tool flags
    allow; the schema lists the plain text request)."""

    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)

    model: Text
    """A model the router serves (`GET /v1/models`)."""
    input: Text | Annotated[list[ResponsesInputMessage], Field(min_length=1)]
    """A string (one user message) or a list of input items."""
    instructions: str | None = None
    """A system message before the input."""
    max_output_tokens: MaxTokens = None
    """Absent: up to the model's context; more than the context leaves is cut to it (vLLM)."""
    stream: bool | None = False
    temperature: Annotated[float | None, Field(ge=0, le=2)] = None
    top_p: Annotated[float | None, Field(gt=0, le=1)] = None
    user: str | None = None


class TokenizeCompletionRequest(Base):
    """vLLM's TokenizeCompletionRequest: a prompt's token ids."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    model: Text
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(Base):
    """vLLM's TokenizeChatRequest: the token ids of messages as the chat template renders them."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    model: Text
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    add_special_tokens: bool = False
    add_generation_prompt: bool = True


class DetokenizeRequest(Base):
    model: Text
    tokens: list[TokenId]


# answers
class UsageInfo(Base):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: JSON | None = None


class TopLogprob(Base):
    token: str
    logprob: float | None
    bytes: list[int] | None = None


class ChatLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(Base):
    content: list[ChatLogprob] | None


class CompletionLogprobs(Base):
    text_offset: list[int]
    token_logprobs: list[float | None]
    tokens: list[str]
    top_logprobs: list[dict[str, float | None] | None]


class FunctionCall(Base):
    name: str | Absent = None
    arguments: str | Absent = None
    """The arguments as JSON text (streamed in pieces)."""


class ToolCall(Base):
    id: str | Absent = None
    type: Literal["function"] = "function"
    index: int | Absent = None
    """Streamed calls only: which call a delta continues."""
    function: FunctionCall


class ChatAnswer(Base):
    """The assistant's message."""

    role: Literal["assistant"]
    content: str | None
    refusal: str | None = None
    tool_calls: list[ToolCall] | Absent = None
    reasoning: str | None = None


FinishReason = str | None
"""stop, length, tool_calls (vLLM's also abort, error, repetition); null until the last token."""
StopReason = int | str | None
"""The stop string or token id that ended the choice (vLLM's), null for EOS and the length."""


class ChatChoice(Base):
    index: int
    message: ChatAnswer
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason
    stop_reason: StopReason = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(Base):
    """A chat.completion: one choice per sequence (prompt x n)."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None


class CompletionChoice(Base):
    index: int
    """prompt x n + the choice."""
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReason
    stop_reason: StopReason = None
    prompt_logprobs: list[Any] | None = None


class CompletionResponse(Base):
    """A text_completion: one choice per sequence (prompt x n)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo


class DeltaMessage(Base):
    role: Literal["assistant"] | Absent = None
    content: str | None = None
    tool_calls: list[ToolCall] | Absent = None


class ChatChunkChoice(Base):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: FinishReason = None
    stop_reason: StopReason = None
    token_ids: list[int] | None = None


class ChatCompletionStreamResponse(Base):
    """One `data:` event of a streamed chat completion: the role chunk of each choice, a chunk
    per token, and (stream_options.include_usage) a last one with no choices and the usage."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None


class OutputText(Base):
    type: Literal["output_text"]
    text: str
    annotations: list[Any]


class ResponsesOutputMessage(Base):
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[OutputText]


class ResponsesUsage(Base):
    input_tokens: int
    output_tokens: int
    total_tokens: int


class ResponsesResponse(Base):
    """vLLM 0.32's ResponsesResponse: the request's settings come back too (not listed)."""

    id: str
    object: Literal["response"]
    created_at: int
    model: str
    status: Literal["completed", "incomplete", "in_progress"]
    output: list[ResponsesOutputMessage]
    usage: ResponsesUsage | None = None


class CompletionChunkChoice(Base):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReason = None
    stop_reason: StopReason = None


class CompletionStreamResponse(Base):
    """One `data:` event of a streamed completion (a chunk per token; the usage last, as chat's)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChunkChoice]
    usage: UsageInfo | None = None


class TokenizeResponse(Base):
    count: int
    """What the engine charges for the same prompt (`usage.prompt_tokens`)."""
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None
    """With return_token_strs: true."""


class DetokenizeResponse(Base):
    prompt: str


class ModelCard(Base):
    id: str
    object: Literal["model"]
    created: int | Absent = None
    owned_by: str | Absent = None
    max_model_len: int | Absent = None
    """The largest context among the model's engines, once one said it."""
    root: str | Absent = None
    """A LoRA adapter's path (vLLM's ModelCard)."""
    parent: str | Absent = None
    """A LoRA adapter's base model (vLLM's ModelCard)."""


class ModelList(Base):
    object: Literal["list"]
    data: list[ModelCard]


class ErrorInfo(Base):
    message: str
    type: str
    """vLLM's error type ("BadRequestError", "Bad Request" for a field of the wrong type,
    "NotFoundError"); the router's 400s are "BadRequestError" too, its others its own
    ("authentication_error", "rate_limit_error", ...)."""
    param: str | None = None
    """The parameter at fault (vLLM: "body.<field>" for a field of the wrong type)."""
    code: int
    """The HTTP status."""


class ErrorResponse(Base):
    """An error in OpenAI's shape."""

    error: ErrorInfo
