"""Errors a client gets in OpenAI's shape (`{"error": {"message", "type", "param", "code"}}`)."""

from __future__ import annotations

import json


class ApiError(Exception):
    """An error the client gets in OpenAI's shape."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def body(self) -> bytes:
        return error_body(self.status, self.message, self.kind, self.param)


def error_body(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "param": param, "code": status}}).encode()
