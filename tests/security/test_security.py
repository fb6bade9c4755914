"""The router's security points, each against the real router on loopback: keys (401 in OpenAI's
shape), no SLO-class escalation (403), admin routes closed without the admin key, size and
token limits, no upstream address taken from a client, keys never logged nor exposed, and the
router bound where its config says (the local config: loopback only)."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket

import pytest

from isleserve.settings import app_args_from_serve_config
from router.cli import table_from_config
from router.config import RouterConfig, sha256
from router.server import Router
from tests.conftest import ROOT
from tests.security.conftest import (
    ADMIN_KEY,
    BATCH_KEY,
    KEYS,
    LONG,
    MAX_BODY_BYTES,
    MAX_TOKENS_LIMIT,
    MODEL,
    USER_KEY,
    Deployment,
    assert_openai_error,
    call,
)
from tests.support.engines import wait_until_idle
from tests.support.stubhttp import read_request

pytestmark = pytest.mark.integration
GENERATE = ("/v1/chat/completions", "/v1/completions")
ADMIN = ("/admin/replicas", "/admin/topology", "/admin/plan")
WRONG_KEY = "sk-isle-test-wrong-4c6e8a0b2d"


def body_for(path: str, prompt: str = "hi", **extra: object) -> bytes:
    payload: dict[str, object] = {"model": MODEL, "max_tokens": 2, **extra}
    if path.endswith("chat/completions"):
        payload["messages"] = [{"role": "user", "content": prompt}]
    else:
        payload["prompt"] = prompt
    return json.dumps(payload).encode()


@pytest.mark.parametrize("path", [*GENERATE, "/v1/models"])
@pytest.mark.parametrize("authorization", [None, f"Bearer {WRONG_KEY}", "Bearer ", "Bearer", f"Basic {USER_KEY}",
                                           USER_KEY, f"Bearer {USER_KEY}x", f"Bearer {ADMIN_KEY}",
                                           f"Bearer {sha256(USER_KEY)}"])
def test_unauthenticated_and_wrong_keys_get_401(deployment: Deployment, path: str, authorization: str | None) -> None:
    headers = {"authorization": authorization} if authorization is not None else {}
    data = body_for(path) if path in GENERATE else None
    status, _, reply = call(deployment.base + path, data, key=None, headers=headers)
    error = assert_openai_error(status, reply, 401)
    assert error["type"] == "authentication_error"


@pytest.mark.parametrize("headers", [{"x-slo-class": "interactive"}, {"x-slo-class": "standard"},
                                     {"X-SLO-CLASS": "interactive"}])
def test_a_key_cannot_claim_a_class_above_its_entitlement(deployment: Deployment, headers: dict[str, str]) -> None:
    for path in GENERATE:
        status, _, reply = call(deployment.base + path, body_for(path), key=BATCH_KEY, headers=headers)
        error = assert_openai_error(status, reply, 403)
        assert error["type"] == "permission_error"
    status, _, _ = call(deployment.base + GENERATE[1], body_for(GENERATE[1]), key=BATCH_KEY,
                        headers={"x-slo-class": "batch"})
    assert status == 200


def test_a_repeated_class_header_does_not_escalate(deployment: Deployment) -> None:
    with socket.create_connection((deployment.host, deployment.port), timeout=10) as sock:
        data = body_for(GENERATE[1])
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer %b\r\nx-slo-class: batch\r\n"
                     b"x-slo-class: interactive\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                     b"connection: close\r\n\r\n%b" % (BATCH_KEY.encode(), len(data), data))
        reply = b""
        while part := sock.recv(65536):
            reply += part
    assert reply.startswith(b"HTTP/1.1 400") and b"x-slo-class header is repeated" in reply, reply[:200]


@pytest.mark.parametrize("path", ADMIN)
@pytest.mark.parametrize("key", [None, USER_KEY, BATCH_KEY, WRONG_KEY])
def test_admin_routes_are_closed_without_the_admin_key(deployment: Deployment, path: str, key: str | None) -> None:
    status, _, reply = call(deployment.base + path, key=key)
    assert_openai_error(status, reply, 401 if key is None else 403)
    status, _, reply = call(deployment.base + path, key=ADMIN_KEY)
    assert status in (200, 404)  # open (404: this router was started without a plan)


def test_request_size_and_token_limits(deployment: Deployment) -> None:
    path = GENERATE[1]
    status, _, reply = call(deployment.base + path, body_for(path, "x" * MAX_BODY_BYTES))
    assert_openai_error(status, reply, 413)
    status, _, reply = call(deployment.base + path, body_for(path, max_tokens=MAX_TOKENS_LIMIT + 1))
    assert "limit" in str(assert_openai_error(status, reply, 400)["message"])


@pytest.mark.parametrize("path", GENERATE)
@pytest.mark.parametrize("prompt", ["short", LONG], ids=["mixed", "prefill-decode"])
def test_no_upstream_address_is_taken_from_the_client(deployment: Deployment, path: str, prompt: str) -> None:
    """A client's kv_transfer_params (which would make a decode engine fetch KV from an address
    of the client's choosing) and its Host / X-Forwarded-* headers are never used."""
    canary = f"127.0.0.1:{deployment.canary.port}"
    params = {"do_remote_prefill": True, "remote_engine_id": "evil", "remote_host": "127.0.0.1",
              "remote_port": deployment.canary.port, "remote_request_id": "r", "remote_block_ids": [0]}
    headers = {"host": canary, "x-forwarded-host": canary, "x-forwarded-for": "127.0.0.1",
               "forwarded": f"for=127.0.0.1;host={canary}", "x-isle-replica": "evil"}
    if prompt == LONG:
        wait_until_idle(deployment.base, ADMIN_KEY, ("p1", "d1"))  # a long prompt splits on an idle pair
    status, answer, reply = call(deployment.base + path, body_for(path, prompt, kv_transfer_params=params),
                                 headers=headers)
    assert status == 200, reply[:300]
    assert "kv_transfer_params" not in json.loads(reply)
    assert answer["x-isle-replica"] in ("m1", "d1")
    assert answer.get("x-isle-prefill-replica") == ("p1" if prompt == LONG else None)
    assert deployment.canary.hits == []


def test_forwarded_requests_carry_only_what_the_router_sets() -> None:
    """What reaches the engine: the client's body minus kv_transfer_params, the class's priority
    (not the client's), and none of the client's headers."""
    seen: list[bytes] = []

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head, request = await read_request(reader)
            if not head.startswith(b"POST "):  # the router's /metrics scrape
                writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                return
            seen.append(head + request)
            body = b'{"id":"x","object":"text_completion","choices":[{"index":0,"text":"hi","finish_reason":"stop"}]}'
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%b"
                         % (len(body), body))
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> bytes:
        server = await asyncio.start_server(upstream, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        config = RouterConfig.model_validate({
            "port": 0, "keys": [{"tenant": "b", "key_sha256": sha256(BATCH_KEY), "slo_classes": ["batch"]}],
            "admin_keys": [{"tenant": "ops", "key_sha256": sha256(ADMIN_KEY)}],
            "replicas": [{"replica_id": "r", "url": f"http://127.0.0.1:{port}", "model": "m"}]})
        router = Router(config, table_from_config(config))
        await router.start()
        try:
            raw = json.dumps({"model": "m", "prompt": "x", "priority": -100, "kv_transfer_params": {
                "remote_host": "10.0.0.1", "remote_port": 1}}).encode()
            reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
            writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: 10.0.0.1:1\r\nx-forwarded-host: 10.0.0.1\r\n"
                         b"authorization: Bearer %b\r\nx-secret-header: s3cret\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\nconnection: close\r\n\r\n%b" % (BATCH_KEY.encode(), len(raw), raw))
            reply = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            return reply
        finally:
            await router.stop()
            server.close()

    reply = asyncio.run(main())
    assert reply.startswith(b"HTTP/1.1 200"), reply
    posts = [r for r in seen if r.startswith(b"POST ")]  # (the others: the router scraping /metrics)
    assert len(posts) == 1
    head, _, body = posts[0].partition(b"\r\n\r\n")
    forwarded = json.loads(body)
    assert "kv_transfer_params" not in forwarded and forwarded["priority"] == 2  # batch's priority
    head_text = head.decode().lower()
    assert f"host: 127.0.0.1:{head_text.split('127.0.0.1:')[1].split()[0]}" in head_text
    for leaked in ("10.0.0.1", "x-forwarded", "authorization", BATCH_KEY.lower(), "s3cret"):
        assert leaked not in head_text


def test_keys_are_never_logged_nor_exposed(deployment: Deployment) -> None:
    base = deployment.base
    for key in (*KEYS, WRONG_KEY):
        for path in GENERATE:
            call(base + path, body_for(path), key=key)
            call(base + path, b"{not json", key=key)
        call(base + "/v1/models", key=key)
        for path in ADMIN:
            call(base + path, key=key)
    exposed = [call(base + "/metrics", key=None)[2], call(base + "/health", key=None)[2],
               call(base + "/openapi.json", key=None)[2]]
    exposed += [call(base + path, key=ADMIN_KEY)[2] for path in ADMIN]
    log = deployment.log()
    assert "DEBUG" in log  # the router logged at debug level: the check below means something
    for key in (*KEYS, WRONG_KEY):
        for secret in (key, sha256(key)):
            assert secret not in log
            for text in exposed:
                assert secret.encode() not in text


def test_the_router_binds_only_where_its_config_says(deployment: Deployment) -> None:
    assert deployment.host == "127.0.0.1"
    try:
        probe = socket.create_server(("127.0.0.2", 0))
        probe.close()
    except OSError:
        pytest.skip("127.0.0.2 is not a local address here")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", deployment.port), timeout=5).close()
    others = {str(info[4][0]) for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
    for address in others - {"127.0.0.1"}:
        with pytest.raises(OSError):
            socket.create_connection((address, deployment.port), timeout=2).close()


def test_the_local_config_listens_on_loopback_only() -> None:
    args = app_args_from_serve_config(str(ROOT / "configs" / "local.yaml"))
    assert ipaddress.ip_address(args.router.host).is_loopback
    assert all(ipaddress.ip_address(r.url.split("//")[1].rsplit(":", 1)[0].strip("[]")).is_loopback
               for r in args.router.replicas)
    import yaml

    doc = yaml.safe_load((ROOT / "configs" / "local.yaml").read_text())
    assert doc["proxy_location"] == "Disabled"  # no Ray Serve HTTP proxy listening anywhere
    host = (doc.get("http_options") or {}).get("host", "127.0.0.1")
    assert ipaddress.ip_address(host).is_loopback


def test_metrics_can_be_closed_to_all_but_the_admin_key() -> None:
    """`metrics_auth: admin` (production): Prometheus scrapes with the admin key; users and
    strangers get OpenAI-shaped 401/403, and /health stays open for load balancers."""
    async def main() -> dict[str, bytes]:
        config = RouterConfig.model_validate({
            "port": 0, "metrics_auth": "admin", "keys": [{"tenant": "u", "key_sha256": sha256(USER_KEY)}],
            "admin_keys": [{"tenant": "ops", "key_sha256": sha256(ADMIN_KEY)}],
            "replicas": [{"replica_id": "r", "url": "http://127.0.0.1:9", "model": "m"}]})
        router = Router(config, table_from_config(config))
        await router.start()
        out = {}
        try:
            for name, path, key in (("none", "/metrics", None), ("user", "/metrics", USER_KEY),
                                    ("admin", "/metrics", ADMIN_KEY), ("health", "/health", None)):
                reader, writer = await asyncio.open_connection("127.0.0.1", router.port)
                auth = f"authorization: Bearer {key}\r\n" if key else ""
                writer.write(f"GET {path} HTTP/1.1\r\nhost: x\r\n{auth}connection: close\r\n\r\n".encode())
                out[name] = await asyncio.wait_for(reader.read(), 10)
                writer.close()
        finally:
            await router.stop()
        return out

    replies = asyncio.run(main())
    assert replies["none"].startswith(b"HTTP/1.1 401") and b'"authentication_error"' in replies["none"]
    assert replies["user"].startswith(b"HTTP/1.1 403") and b'"permission_error"' in replies["user"]
    assert replies["admin"].startswith(b"HTTP/1.1 200") and b"isle_router_requests_total" in replies["admin"]
    assert replies["health"].startswith(b"HTTP/1.1 200")
