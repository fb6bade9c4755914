"""Errors a client gets in OpenAI's shape (`{"error": {"message", "type", "param", "code"}}`).

A 400 without a type of its own is "BadRequestError", the type vLLM 0.32 gives every 400 of its
own checks (vllm/entrypoints/serve/exception_handling/error_response.py `create_error_response`),
so the router's 400s and its engines' read alike (a field of the wrong type, pydantic's, stays
vLLM's "Bad Request"); other statuses without one are "invalid_request_error"."""

from __future__ import annotations

import json


class ApiError(Exception):
    """An error the client gets in OpenAI's shape."""

    def __init__(self, status: int, message: str, kind: str = "", param: str | None = None,
                 cause: str = "", headers: tuple[tuple[str, str], ...] = ()) -> None:
        """`cause`: why the router refused it, for its rejection counts (not sent); `headers`:
        sent with it (405's `Allow`)."""
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.cause = status, message, kind or default_kind(status), \
            param, cause
        self.headers = headers

    def body(self) -> bytes:
        return error_body(self.status, self.message, self.kind, self.param)


BAD_REQUEST = "BadRequestError"


def default_kind(status: int) -> str:
    """The error `type` of a status whose error names none (module docstring)."""
    return BAD_REQUEST if status == 400 else "invalid_request_error"


def error_body(status: int, message: str, kind: str = "", param: str | None = None) -> bytes:
    kind = kind or default_kind(status)
    return json.dumps({"error": {"message": message, "type": kind, "param": param, "code": status}}).encode()
