"""wire.client against a fake upstream (httpx.MockTransport): only http:// loopback URLs
are called, timeouts and transport failures become this module's errors with the URL and the
limit in the message, the bearer key and JSON go out, documents and streams come back."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest

from wire import client
from wire.client import AsyncClient, Client, ClientError, NotJson, RefusedUrl, StatusError, TimedOut, Unreachable

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000", "http://127.9.8.7:1/v1", "http://localhost:80",
                                 "http://[::1]:9", "http://[::ffff:127.0.0.1]:9", "http://LOCALHOST"])
def test_loopback_urls_are_called(url: str) -> None:
    assert client.base_url(url).startswith("http://")
    Client(url).close()


@pytest.mark.parametrize("url", ["http://10.1.2.3:8000", "http://example.com", "http://localhost.example.com:80",
                                 "http://[2001:db8::1]:80", "http://0.0.0.0:8000", "https://127.0.0.1:8000",
                                 "ftp://127.0.0.1", "http://127.0.0.1:99999", "127.0.0.1:8000", ""])
def test_other_urls_are_refused_before_anything_is_sent(url: str) -> None:
    with pytest.raises(RefusedUrl) as refused:
        Client(url)
    assert isinstance(refused.value, ValueError) and not isinstance(refused.value, OSError)
    with pytest.raises(RefusedUrl):
        client.get(url + "/health")


def test_a_remote_host_only_where_asked_and_never_https() -> None:
    assert client.base_url("http://10.1.2.3:8000/", remote_ok=True) == "http://10.1.2.3:8000"
    with pytest.raises(RefusedUrl):
        client.base_url("https://10.1.2.3:8000", remote_ok=True)


def test_a_path_is_under_the_base() -> None:
    with Client("http://127.0.0.1:9/prefix", transport=httpx.MockTransport(lambda r: httpx.Response(200))) as c:
        assert c.get("/health").url == "http://127.0.0.1:9/prefix/health"
        with pytest.raises(RefusedUrl):
            c.get("http://10.0.0.1/health")


def test_the_key_and_json_go_out_and_json_comes_back() -> None:
    seen: list[httpx.Request] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"echo": json.loads(request.content or b"null")})

    with Client("http://127.0.0.1:8000", key="sk-1", transport=httpx.MockTransport(upstream)) as c:
        assert c.post_json("/admin/faults", {"x": 1}) == {"echo": {"x": 1}}
        assert c.get_json("/v1/models") == {"echo": None}
    assert [r.headers["authorization"] for r in seen] == ["Bearer sk-1"] * 2
    assert seen[0].headers["content-type"] == "application/json" and seen[0].method == "POST"


def test_an_answer_that_is_not_the_document_asked_for() -> None:
    def upstream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, text="no plan") if request.url.path == "/admin/plan" else httpx.Response(200,
                                                                                                         text="<html>")

    with Client("http://127.0.0.1:8000", transport=httpx.MockTransport(upstream)) as c:
        assert c.get("/admin/plan").status == 404  # any status is an answer
        with pytest.raises(StatusError) as missing:
            c.get_json("/admin/plan")
        assert missing.value.status == 404 and isinstance(missing.value, OSError)
        assert str(missing.value) == "http://127.0.0.1:8000/admin/plan answered HTTP 404: no plan"
        with pytest.raises(NotJson):
            c.get_json("/other")
        assert c.get_text("/other") == "<html>"


@pytest.mark.parametrize(("raised", "kind", "message"), [
    (httpx.ConnectTimeout("slow"), TimedOut, "GET http://127.0.0.1:8000/metrics: no connection within 0.5 s"),
    (httpx.ReadTimeout("slow"), TimedOut, "GET http://127.0.0.1:8000/metrics: nothing read within 2 s"),
    (httpx.ConnectError("[Errno 111] Connection refused"), Unreachable,
     "GET http://127.0.0.1:8000/metrics: ConnectError ([Errno 111] Connection refused)"),
    (httpx.RemoteProtocolError("peer closed connection"), Unreachable,
     "GET http://127.0.0.1:8000/metrics: RemoteProtocolError (peer closed connection)")])
def test_failures_become_clear_errors(raised: Exception, kind: type[ClientError], message: str) -> None:
    def upstream(request: httpx.Request) -> httpx.Response:
        raise raised

    with Client("http://127.0.0.1:8000", timeout_s=2, connect_timeout_s=0.5,
                transport=httpx.MockTransport(upstream)) as c, pytest.raises(kind) as failed:
        c.get_text("/metrics")
    assert str(failed.value) == message and failed.value.kind == type(raised).__name__
    assert isinstance(failed.value, OSError)
    if kind is TimedOut:
        assert isinstance(failed.value, TimeoutError)


def test_a_stream_comes_in_pieces_and_failures_mid_body_are_mapped() -> None:
    async def body(fail: bool) -> AsyncIterator[bytes]:
        yield b"data: 1\n\n"
        yield b"data: 2\n\n"
        if fail:
            raise httpx.ReadError("reset")

    def upstream(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"x-isle-replica": "m1"}, content=body(request.url.path == "/fail"))

    async def run() -> tuple[list[bytes], str, str]:
        async with AsyncClient("http://127.0.0.1:8000", transport=httpx.MockTransport(upstream)) as c:
            async with c.stream("POST", "/ok", json_body={"stream": True}) as answer:
                pieces = [p async for p in answer.chunks()]
                replica = answer.headers["X-Isle-Replica"]
            with pytest.raises(Unreachable) as failed:
                async with c.stream("POST", "/fail", content=b"{}") as answer:
                    await answer.read()
            return pieces, replica, failed.value.kind

    assert asyncio.run(run()) == ([b"data: 1\n\n", b"data: 2\n\n"], "m1", "ReadError")


def test_async_documents_and_a_timeout() -> None:
    def upstream(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/slow":
            raise httpx.ReadTimeout("slow")
        return httpx.Response(200, json={"replicas": 2})

    async def run() -> None:
        async with AsyncClient("http://127.0.0.1:8000", timeout_s=1.5, transport=httpx.MockTransport(upstream)) as c:
            assert await c.get_json("/health") == {"replicas": 2}
            assert await c.post_json("/x", [1]) == {"replicas": 2}
            with pytest.raises(TimedOut, match=r"GET http://127.0.0.1:8000/slow: nothing read within 1.5 s"):
                await c.get_text("/slow")

    asyncio.run(run())
