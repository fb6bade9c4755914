"""The simulated engine's test kit: one engine process shared by the whole session (the tests
that only talk to it: generation, vLLM compatibility), an openai client of it (closed after each
test, tests/support/clients.py), and plain JSON GET/POST against it.

Started once per session (per xdist worker) with the flags those tests had each started it with:
a test that needs other flags, faults, or its own process starts its own (running_engine)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.support.clients import openai_client
from tests.support.engines import EngineProcess, running_engine

MODEL = "llama-3.1-8b"
ENGINE_FLAGS = ("--model", MODEL, "--gpu", "h100-sxm", "--time-scale", "0.02")


@pytest.fixture(scope="session")
def engine() -> Iterator[EngineProcess]:
    """One llama-3.1-8b engine on an H100, 50x fast, for the session."""
    with running_engine(*ENGINE_FLAGS) as e:
        yield e


def client(e: EngineProcess) -> openai.OpenAI:
    """An openai client of this engine, closed after the test."""
    return openai_client(e.url, "unused")


def post(url: str, body: Any, content_type: str = "application/json") -> tuple[int, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        with err:
            return err.code, json.loads(err.read())


def get(url: str) -> tuple[int, Any]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.status, json.loads(resp.read())
