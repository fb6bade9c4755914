"""Request fields read as vLLM's pydantic request models read them, and its two error shapes.

vLLM 0.32 answers a request that fails its models with HTTP 400 and `{"error": {"message",
"type", "param", "code": 400}}`, in one of two shapes:

- a field of the wrong type (pydantic `ValidationError`, FastAPI's `RequestValidationError`):
  `type` "Bad Request", `param` the field's location ("body.stop"), `message` "N validation
  error(s):" and one line per error (vllm/entrypoints/serve/exception_handling/handlers/
  validation.py, `validation_exception_handler`, `clean_loc_for_param`);
- a check of vLLM's own (`VLLMValidationError` from a model validator, SamplingParams or the
  renderer): `type` "BadRequestError", `param` the check's parameter (or null), `message` the
  check's text plus " (parameter=..., value=...)" (vllm/exceptions.py `VLLMValidationError.__str__`,
  exception_handling/error_response.py `create_error_response`).

Types coerce as pydantic's lax mode does: an int field takes 5, 5.0, "5" and true; a float field
ints and numeric strings; a bool field true/false, 0/1 and "yes"/"no"-like strings. A field read
here that fails is collected, and all of a request's type errors are reported at once.
"""

from __future__ import annotations

import math
from typing import Any

from wire.errors import ApiError
from wire.openai import INT64

VALIDATION = "Bad Request"
"""`type` of a pydantic validation error (HTTPStatus.BAD_REQUEST.phrase)."""
BAD_REQUEST = "BadRequestError"
"""`type` of a VLLMValidationError."""
MAX_REPORTED_ERRORS = 10
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


def vllm_error(message: str, parameter: str | None = None, value: Any = None) -> ApiError:
    """A VLLMValidationError as vLLM answers it."""
    extras = [f"parameter={parameter}"] if parameter is not None else []
    if value is not None:
        extras.append(f"value={value}")
    text = f"{message} ({', '.join(extras)})" if extras else message
    return ApiError(400, text, BAD_REQUEST, parameter)


def over_max_model_len(param: str, asked: int, max_model_len: int) -> ApiError:
    """vLLM's refusal of a max_tokens over the context (`get_max_tokens`)."""
    return vllm_error(f"{param}={asked} cannot be greater than max_model_len={max_model_len}. Please request fewer "
                      "output tokens.", param, asked)


def prompt_over_context(prompt_tokens: int, max_model_len: int) -> ApiError:
    """vLLM's refusal of a prompt longer than the context (TokenizeParams)."""
    return vllm_error(f"This model's maximum context length is {max_model_len} tokens. However, your prompt "
                      f"contains {prompt_tokens} input tokens, which exceeds this limit even without any output "
                      "tokens. Please reduce the length of the input prompt.", "input_tokens", prompt_tokens)


def _summary(value: Any) -> str:
    if isinstance(value, (list, tuple, dict)):
        return f"<{type(value).__name__} of {len(value)} items>"
    text = str(value)
    return text[:200] + "...[truncated]" if len(text) > 200 else text


class Errors:
    """Type errors of one request body, reported together (as pydantic reports them)."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str, str, Any]] = []
        """(type, loc, msg, input) each; loc as vLLM cleans it ("body.stop")."""

    def add(self, kind: str, loc: str, msg: str, value: Any) -> None:
        self.items.append((kind, loc, msg, value))

    def raise_any(self) -> None:
        if not self.items:
            return
        count = len(self.items)
        label = "error" if count == 1 else "errors"
        lines = [f"  {{'type': {k!r}, 'loc': {loc!r}, 'msg': {msg!r}, 'input': {_summary(v)!r}}}"
                 for k, loc, msg, v in self.items[:MAX_REPORTED_ERRORS]]
        if count > MAX_REPORTED_ERRORS:
            lines.append(f"  ...and {count - MAX_REPORTED_ERRORS} more {label}")
        raise ApiError(400, f"{count} validation {label}:\n" + "\n".join(lines), VALIDATION, self.items[0][1])


def as_int(value: Any) -> int | None:
    """`value` as pydantic's lax int reads it, or None when it is not one."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None


class Body:
    """One request body's fields, read with their types; failures go to `errors`."""

    def __init__(self, body: dict[str, Any], errors: Errors | None = None) -> None:
        self.body, self.errors = body, errors if errors is not None else Errors()

    def _missing(self, name: str, nullable: bool, default: Any) -> tuple[bool, Any]:
        if name not in self.body:
            return True, default
        if self.body[name] is None:
            if nullable:
                return True, default
            return False, None
        return False, None

    def text(self, name: str, default: str | None = None, nullable: bool = True) -> str | None:
        done, out = self._missing(name, nullable, default)
        if done:
            return out  # type: ignore[no-any-return]
        value = self.body[name]
        if isinstance(value, str):
            return value
        self.errors.add("string_type", f"body.{name}", "Input should be a valid string", value)
        return default

    def integer(self, name: str, default: int | None = None, nullable: bool = True,
            bounds: tuple[int, int] = INT64) -> int | None:
        done, out = self._missing(name, nullable, default)
        if done:
            return out  # type: ignore[no-any-return]
        value = self.body[name]
        got = as_int(value)
        if got is None:
            if isinstance(value, float) and math.isfinite(value):
                self.errors.add("int_from_float", f"body.{name}",
                                "Input should be a valid integer, got a number with a fractional part", value)
            elif isinstance(value, str):
                self.errors.add("int_parsing", f"body.{name}",
                                "Input should be a valid integer, unable to parse string as an integer", value)
            else:
                self.errors.add("int_type", f"body.{name}", "Input should be a valid integer", value)
            return default
        if got < bounds[0]:
            self.errors.add("greater_than_equal", f"body.{name}", f"Input should be greater than or equal to "
                            f"{bounds[0]}", value)
            return default
        if got > bounds[1]:
            self.errors.add("less_than_equal", f"body.{name}", f"Input should be less than or equal to {bounds[1]}",
                            value)
            return default
        return got

    def number(self, name: str, default: float | None = None, nullable: bool = True) -> float | None:
        done, out = self._missing(name, nullable, default)
        if done:
            return out  # type: ignore[no-any-return]
        value = self.body[name]
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                self.errors.add("float_parsing", f"body.{name}",
                                "Input should be a valid number, unable to parse string as a number", value)
                return default
        self.errors.add("float_type", f"body.{name}", "Input should be a valid number", value)
        return default

    def flag(self, name: str, default: bool = False, nullable: bool = False) -> bool:
        done, out = self._missing(name, nullable, default)
        if done:
            return bool(out)
        value = self.body[name]
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        if isinstance(value, str):
            self.errors.add("bool_parsing", f"body.{name}", "Input should be a valid boolean, unable to interpret "
                            "input", value)
        else:
            self.errors.add("bool_type", f"body.{name}", "Input should be a valid boolean", value)
        return default

    def mapping(self, name: str) -> dict[str, Any] | None:
        value = self.body.get(name)
        if value is None or isinstance(value, dict):
            return value
        self.errors.add("dict_type", f"body.{name}", "Input should be a valid dictionary", value)
        return None

    def int_list(self, name: str) -> list[int]:
        value = self.body.get(name)
        if value is None:
            return []
        if not isinstance(value, list):
            self.errors.add("list_type", f"body.{name}", "Input should be a valid list", value)
            return []
        out = []
        for k, item in enumerate(value):
            got = as_int(item)
            if got is None:
                self.errors.add("int_type", f"body.{name}.{k}", "Input should be a valid integer", item)
            else:
                out.append(got)
        return out

    def str_list(self, name: str, nullable: bool = True) -> list[str]:
        value = self.body.get(name)
        if value is None and nullable:
            return []
        if not isinstance(value, list):
            self.errors.add("list_type", f"body.{name}", "Input should be a valid list", value)
            return []
        bad = [k for k, item in enumerate(value) if not isinstance(item, str)]
        for k in bad:
            self.errors.add("string_type", f"body.{name}.{k}", "Input should be a valid string", value[k])
        return [] if bad else list(value)

    def stop(self, max_strings: int) -> list[str]:
        """`stop`: a string, a list of at most `max_strings` strings, or null (vLLM's StopParam,
        vllm/entrypoints/generate/base/protocol.py; VLLM_MAX_STOP_STRINGS = 4)."""
        value = self.body.get("stop")
        if value is None:
            return []
        if isinstance(value, str):
            return [value]
        if isinstance(value, list) and all(isinstance(s, str) for s in value):
            if len(value) <= max_strings:
                return list(value)
            self.errors.add("string_type", "body.stop", "Input should be a valid string", value)
            self.errors.add("too_long", "body.stop", f"List should have at most {max_strings} items after "
                            f"validation, not {len(value)}", value)
            return []
        self.errors.add("string_type", "body.stop", "Input should be a valid string", value)
        self.errors.add("list_type", "body.stop", "Input should be a valid list", value)
        return []
