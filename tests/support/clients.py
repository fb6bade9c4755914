"""openai clients that the end of the test closes (tests/conftest.py `_leave_nothing_open`).

A client left open keeps its keep-alive sockets until the garbage collector finds it, and the
collector's ResourceWarning (an error under pyproject's filterwarnings) then lands in whichever
test happens to be running. Open clients here only inside a test, never in a fixture that
outlives it."""

from __future__ import annotations

import openai

_OPEN: list[openai.OpenAI] = []


def openai_client(base_url: str, key: str, timeout: float = 60.0) -> openai.OpenAI:
    """A client with no retries (a test sees every error), closed when the test ends."""
    c = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=timeout)
    _OPEN.append(c)
    return c


def close_all() -> None:
    while _OPEN:
        _OPEN.pop().close()
