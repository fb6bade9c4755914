"""Bad input against the real router on loopback: malformed, truncated and oversized requests,
invalid parameters, unknown models, huge token counts, non-UTF-8 bytes, too many or too large
headers. Each gets a 4xx in OpenAI's shape, quickly: never a 5xx, never a crash, never a hang."""

from __future__ import annotations

import json
import socket
import time

import pytest

from tests.security.conftest import (
    MAX_BODY_BYTES,
    MAX_TOKENS_LIMIT,
    MODEL,
    READ_TIMEOUT_S,
    USER_KEY,
    Deployment,
    assert_openai_error,
    call,
)

pytestmark = pytest.mark.integration
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
HI = [{"role": "user", "content": "hi"}]


def raw(dep: Deployment, data: bytes, timeout_s: float = 10.0) -> tuple[int, bytes, float]:
    """Send bytes as they are; read until the router closes. The status, body and seconds taken."""
    t0 = time.monotonic()
    with socket.create_connection((dep.host, dep.port), timeout=timeout_s) as sock:
        sock.sendall(data)
        chunks = []
        while True:
            try:
                part = sock.recv(65536)
            except ConnectionResetError:
                break
            if not part:
                break
            chunks.append(part)
            head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
            length = [int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(
                b"content-length:")]
            if length and len(body) >= length[0]:
                break
    reply = b"".join(chunks)
    assert reply, "no answer"
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body, time.monotonic() - t0


def post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return (b"POST %b HTTP/1.1\r\nhost: x\r\nauthorization: Bearer %b\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n%b\r\n%b" % (path.encode(), USER_KEY.encode(), len(body), extra, body))


@pytest.mark.parametrize("body", [b'{"model": ', b"", b"null", b"[1, 2]", b'"text"', b"{'model': 'x'}",
                                  b'{"model": "m", "max_tokens": NaN}', b'{"a": 1e999}', b"\xff\xfe\x00{}",
                                  b'{"model": "\xc3\x28"}', b'{"model": "\\ud800"}'])
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_malformed_and_non_utf8_json_is_400(deployment: Deployment, path: str, body: bytes) -> None:
    status, _, reply = call(deployment.base + path, body)
    assert_openai_error(status, reply, 400)


BAD_PARAMETERS = [  # as vLLM 0.32 refuses them (what its lax pydantic parsing accepts, "5", true for 1, is not here)
    ({"max_tokens": -1}, "max_tokens"), ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": "ten"}, "max_tokens"),
    ({"max_tokens": 1.5}, "max_tokens"), ({"n": 0}, "n"),
    ({"n": "two"}, "n"), ({"temperature": -0.1}, "temperature"),
    ({"temperature": "hot"}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"stream": "maybe"}, "stream"), ({"stream_options": 3}, "stream_options"), ({"seed": "s"}, "seed"),
    ({"messages": "hi"}, "messages"), ({"messages": []}, "messages"), ({"messages": [{"content": "x"}]}, "messages"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages"), ({"model": 5}, "model"), ({"model": ""}, "model"),
    ({"model": None}, "model"), ({"max_completion_tokens": -3}, "max_completion_tokens"),
]
"""vLLM names a field of the wrong type by its location (`body.max_tokens`, pydantic's loc), a
failed check of its own by the parameter (`max_tokens`), and SamplingParams' checks in the message."""


@pytest.mark.parametrize(("change", "param"), BAD_PARAMETERS, ids=[json.dumps(c) for c, _ in BAD_PARAMETERS])
def test_invalid_parameters_are_400_naming_the_parameter(deployment: Deployment, change: dict[str, object],
                                                          param: str) -> None:
    body = {"model": MODEL, "messages": HI, "max_tokens": 2, **change}
    status, _, reply = call(deployment.base + CHAT, json.dumps(body).encode())
    error = assert_openai_error(status, reply, 400)
    names = (param, "max_tokens") if param == "max_completion_tokens" else (param,)
    named = error["param"] in {*names, *(f"body.{n}" for n in names)}
    # SamplingParams' own checks carry no parameter (vllm/sampling_params.py): the message names it
    assert named or (error["param"] is None and any(n in str(error["message"]) for n in names)), error


@pytest.mark.parametrize("prompt", [5, None, [], {"text": "x"}, [1, "a"], [[]], [-1], [[1], "a"], [True]])
def test_invalid_prompts_are_400(deployment: Deployment, prompt: object) -> None:
    status, _, reply = call(deployment.base + COMPLETIONS, json.dumps({"model": MODEL, "prompt": prompt}).encode())
    assert_openai_error(status, reply, 400)


def test_unknown_model_is_404(deployment: Deployment) -> None:
    status, _, reply = call(deployment.base + CHAT, json.dumps({"model": "gpt-9", "messages": HI}).encode())
    error = assert_openai_error(status, reply, 404)
    assert "gpt-9" in str(error["message"]) and error["param"] == "model"


@pytest.mark.parametrize(("key", "value"), [("max_tokens", MAX_TOKENS_LIMIT + 1), ("max_tokens", 2**62),
                                            ("max_completion_tokens", 10**9), ("max_tokens", 10**30)])
def test_huge_max_tokens_is_400(deployment: Deployment, key: str, value: int) -> None:
    status, _, reply = call(deployment.base + COMPLETIONS, json.dumps({"model": MODEL, "prompt": "x",
                                                                        key: value}).encode())
    error = assert_openai_error(status, reply, 400)
    if value < 2**63:  # a larger integer is a float to the JSON parser: the engine says it is no int
        assert str(MAX_TOKENS_LIMIT) in str(error["message"]) and error["param"] == key


def test_oversized_body_is_413(deployment: Deployment) -> None:
    body = json.dumps({"model": MODEL, "prompt": "x" * MAX_BODY_BYTES}).encode()
    status, _, reply = call(deployment.base + COMPLETIONS, body)
    assert_openai_error(status, reply, 413)


def test_truncated_body_is_408_after_the_read_timeout(deployment: Deployment) -> None:
    status, body, took_s = raw(deployment, post(COMPLETIONS, b'{"model": "x", "prompt": "only part of it"}')[:-10])
    assert_openai_error(status, body, 408)
    assert READ_TIMEOUT_S * 0.8 <= took_s < READ_TIMEOUT_S + 3


def test_unfinished_headers_are_408(deployment: Deployment) -> None:
    status, body, took_s = raw(deployment, b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthori")
    assert_openai_error(status, body, 408)
    assert took_s < READ_TIMEOUT_S + 3


@pytest.mark.parametrize("data", [
    b"BLAH\x00 nonsense\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n", b"\xff\xfe\xfd\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\ncontent-length: -5\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nab",
    b"POST /v1/completions HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
])
def test_malformed_http_is_400_in_openai_shape(deployment: Deployment, data: bytes) -> None:
    status, body, _ = raw(deployment, data)
    assert_openai_error(status, body, 400)


def test_an_upgrade_is_refused_with_one_response(deployment: Deployment) -> None:
    with socket.create_connection((deployment.host, deployment.port), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n")
        reply = b""
        while part := sock.recv(65536):
            reply += part
    assert reply.startswith(b"HTTP/1.1 400") and b"upgrades are not supported" in reply
    assert reply.count(b"HTTP/1.1 ") == 1  # refused once: the request is not also served


def test_too_many_headers_is_431(deployment: Deployment) -> None:
    extra = b"".join(b"x-h%d: v\r\n" % i for i in range(300))
    status, body, _ = raw(deployment, post(COMPLETIONS, b'{"model": "x", "prompt": "x"}', extra))
    assert_openai_error(status, body, 431)


@pytest.mark.parametrize("extra", [b"x-big: " + b"v" * 200_000 + b"\r\n",
                                   b"".join(b"x-%d: %b\r\n" % (i, b"v" * 1000) for i in range(90))])
def test_too_large_headers_are_431(deployment: Deployment, extra: bytes) -> None:
    status, body, _ = raw(deployment, post(COMPLETIONS, b'{"model": "x", "prompt": "x"}', extra))
    assert_openai_error(status, body, 431)


def test_huge_url_is_431(deployment: Deployment) -> None:
    status, body, _ = raw(deployment, b"GET /" + b"a" * 200_000 + b" HTTP/1.1\r\nhost: x\r\n\r\n")
    assert_openai_error(status, body, 431)


@pytest.mark.parametrize("header", [b"x-slo-class: \xff\xfe", b"authorization: Bearer \xff\x00k",
                                    b"x-slo-class: " + "interactive\u00e9".encode()])
def test_non_utf8_header_values_are_4xx(deployment: Deployment, header: bytes) -> None:
    status, body, _ = raw(deployment, post(COMPLETIONS, json.dumps({"model": MODEL, "prompt": "x"}).encode(),
                                           header + b"\r\n"))
    assert_openai_error(status, body, (400, 401))


def test_unknown_routes_are_404_and_wrong_methods_405_with_allow(deployment: Deployment) -> None:
    """RFC 9110 §15.5.6: a known path asked with another method is 405 and says what it allows."""
    for method, path in (("GET", "/v1/nothing"), ("GET", "/%ff%fe"), ("GET", "/v1/../admin/plan")):
        status, _, reply = call(deployment.base + path, None, method=method)
        assert_openai_error(status, reply, 404)
    for method, path, allow in (("GET", "/v1/chat/completions", "POST"), ("DELETE", "/v1/models", "GET, HEAD"),
                                ("POST", "/admin/plan", "GET, HEAD"), ("TRACE", "/v1/models", "GET, HEAD"),
                                ("GET", "/tokenize", "POST"), ("PUT", "/v1/completions", "POST")):
        status, headers, reply = call(deployment.base + path, None, method=method)
        assert_openai_error(status, reply, 405)
        assert headers["allow"] == allow, (method, path, headers)


def test_the_router_is_still_well_and_logged_no_handler_error(deployment: Deployment) -> None:
    status, _, reply = call(deployment.base + COMPLETIONS, json.dumps({"model": MODEL, "prompt": "x",
                                                                       "max_tokens": 2}).encode())
    assert status == 200 and json.loads(reply)["usage"]["completion_tokens"] == 2
    assert "handler error" not in deployment.log() and "Traceback" not in deployment.log()
