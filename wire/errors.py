"""Errors a client gets in OpenAI's shape (`{"error": {"message", "type", "param", "code"}}`)."""

from __future__ import annotations

import json


class ApiError(Exception):
    """An error the client gets in OpenAI's shape."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 cause: str = "", headers: tuple[tuple[str, str], ...] = ()) -> None:
        """`cause`: why the router refused it, for its rejection counts (not sent); `headers`:
        sent with it (405's `Allow`)."""
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.cause = status, message, kind, param, cause
        self.headers = headers

    def body(self) -> bytes:
        return error_body(self.status, self.message, self.kind, self.param)


def error_body(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "param": param, "code": status}}).encode()
