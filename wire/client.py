"""The one HTTP client of everything here that is not the router's request path (router.relay,
router.flight and router.pd's relay speak raw sockets; router.bench measures with its own):
engine health and /metrics, KV claims, admin and status calls, the load-test client. httpx
underneath, sync (`Client`) and async (`AsyncClient`), with what every caller here needs fixed
once:

- the base URL is http:// on a loopback host (127.0.0.0/8, ::1 and IPv4-mapped, localhost),
  checked before anything is sent; `remote_ok=True` only for tools that may address the product
  where an operator put it (`isle status --url`, `isle run` polling the address it bound);
- a connect timeout and a timeout on every read (None: no limit; the caller bounds the whole
  request itself); proxies from the environment are ignored (a loopback call through
  $HTTP_PROXY would be a surprise);
- a bearer key, JSON in and out, keep-alive connections per client, bodies streamed as they
  arrive (`AsyncClient.stream`: SSE pieces timed as they are read).

Errors, one tree; all but `RefusedUrl` are OSErrors, so `except OSError` still means "the peer
is not answering as asked":

    ClientError           a request through this module failed
      RefusedUrl          (also ValueError) not an http:// URL on a loopback host: nothing sent
      Unreachable         (ConnectionError) connect refused or failed, reset, not HTTP
      TimedOut            (TimeoutError) no connection, answer or next byte within the timeout
      StatusError         an answer, not 2xx, where a document was asked for (`status`, `body`)
      NotJson             (also ValueError) a 2xx answer whose body is not JSON
"""

from __future__ import annotations

import contextlib
import ipaddress
import ssl
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson

DEFAULT_TIMEOUT_S = 5.0
_PLAIN = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
"""httpx builds a TLS context per client (30 ms with the system's CAs); only http:// is allowed
here, so every client shares this one, which is never used."""


class ClientError(Exception):
    """A request through wire.client failed; the message names the URL and why, `kind`
    names what failed in a word (httpx's name for it: ConnectError, RemoteProtocolError,
    ReadTimeout, ...; else the class's own)."""

    def __init__(self, message: str, kind: str = "") -> None:
        super().__init__(message)
        self.kind = kind or type(self).__name__


class RefusedUrl(ClientError, ValueError):
    pass


class Unreachable(ClientError, ConnectionError):
    pass


class TimedOut(ClientError, TimeoutError):
    pass


class StatusError(ClientError, OSError):
    def __init__(self, url: str, status: int, body: bytes) -> None:
        detail = body[:200].decode("utf-8", "replace").strip()
        super().__init__(f"{url} answered HTTP {status}" + (f": {detail}" if detail else ""), f"HTTP {status}")
        self.url, self.status, self.body = url, status, body


class NotJson(ClientError, ValueError):
    pass


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1, ::ffff:127.x.y.z, or localhost."""
    if host.lower() == "localhost":
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = addr.ipv4_mapped if isinstance(addr, ipaddress.IPv6Address) else None
    return addr.is_loopback or bool(mapped and mapped.is_loopback)


def origin(host: str, port: int) -> str:
    """http://HOST:PORT, an IPv6 host in brackets."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def base_url(url: str, *, remote_ok: bool = False) -> str:
    """`url` (http://HOST[:PORT][/prefix]) checked, without a trailing slash."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.scheme != "http" or not host:
        raise RefusedUrl(f"{url!r}: only http://HOST:PORT URLs are called")
    if not remote_ok and not is_loopback(host):
        raise RefusedUrl(f"{url!r}: host {host} is not a loopback address (127.0.0.0/8, ::1 or localhost)")
    try:
        port = parts.port or 80
    except ValueError:
        raise RefusedUrl(f"{url!r}: bad port") from None
    return origin(host, port) + parts.path.rstrip("/")


def split_url(url: str, *, remote_ok: bool = False) -> tuple[str, str]:
    """(checked base, path with query) of a full URL, for one-shot calls."""
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return base_url(f"{parts.scheme}://{parts.netloc}", remote_ok=remote_ok), path


@dataclass(frozen=True, slots=True)
class Reply:
    """A whole answer: status, lower-cased headers, body."""

    url: str
    status: int
    headers: Mapping[str, str]
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        """The body as JSON, for a 2xx answer (StatusError, NotJson otherwise)."""
        if not self.ok:
            raise StatusError(self.url, self.status, self.body)
        try:
            return orjson.loads(self.body)
        except orjson.JSONDecodeError:
            raise NotJson(f"{self.url}: the answer is not JSON ({self.body[:80]!r})") from None


_TIMEOUTS: dict[type[httpx.TimeoutException], tuple[str, str]] = {
    httpx.ConnectTimeout: ("no connection", "connect"), httpx.WriteTimeout: ("could not send", "write"),
    httpx.PoolTimeout: ("no free connection", "pool")}


@contextlib.contextmanager
def _mapped(method: str, url: str, timeout: httpx.Timeout) -> Iterator[None]:
    """httpx's exceptions as this module's."""
    try:
        yield
    except httpx.TimeoutException as err:
        what, phase = _TIMEOUTS.get(type(err), ("nothing read", "read"))
        limit = timeout.as_dict()[phase]
        raise TimedOut(f"{method} {url}: {what} within {limit:g} s" if limit is not None
                       else f"{method} {url}: {what}", type(err).__name__) from None
    except (httpx.TransportError, httpx.StreamError) as err:
        raise Unreachable(f"{method} {url}: {type(err).__name__}{f' ({err})' if str(err) else ''}",
                          type(err).__name__) from None


class _Base:
    def __init__(self, base: str, key: str | None, timeout_s: float | None, connect_timeout_s: float | None,
                 remote_ok: bool) -> None:
        self.base = base_url(base, remote_ok=remote_ok)
        self.headers = {"authorization": f"Bearer {key}"} if key else {}
        connect = connect_timeout_s if connect_timeout_s is not None else timeout_s
        self.timeout = httpx.Timeout(timeout_s, connect=connect, pool=None)

    def url(self, path: str) -> str:
        if not path.startswith("/"):
            raise RefusedUrl(f"{path!r}: a path under {self.base} starts with /")
        return self.base + path

    def request_headers(self, headers: Mapping[str, str] | None, json_body: bool) -> dict[str, str]:
        out = {**self.headers, **(headers or {})}
        if json_body:
            out.setdefault("content-type", "application/json")
        return out


def _content(json_body: Any, content: bytes | None) -> bytes | None:
    return orjson.dumps(json_body) if json_body is not None else content


def _reply(url: str, resp: httpx.Response) -> Reply:
    return Reply(url=url, status=resp.status_code, headers=dict(resp.headers), body=resp.content)


class Client(_Base):
    """Synchronous; one per base URL, or one-shot through `get`, `get_json`, `post_json` below."""

    def __init__(self, base: str, *, key: str | None = None, timeout_s: float | None = DEFAULT_TIMEOUT_S,
                 connect_timeout_s: float | None = None, remote_ok: bool = False,
                 transport: httpx.BaseTransport | None = None) -> None:
        super().__init__(base, key, timeout_s, connect_timeout_s, remote_ok)
        self.client = httpx.Client(timeout=self.timeout, trust_env=False, verify=_PLAIN, transport=transport)

    def request(self, method: str, path: str, *, json_body: Any = None, content: bytes | None = None,
                headers: Mapping[str, str] | None = None) -> Reply:
        """Any status is an answer; failing to get one is a ClientError."""
        url = self.url(path)
        with _mapped(method, url, self.timeout):
            resp = self.client.request(method, url, content=_content(json_body, content),
                                       headers=self.request_headers(headers, json_body is not None))
        return _reply(url, resp)

    def get(self, path: str) -> Reply:
        return self.request("GET", path)

    def get_json(self, path: str) -> Any:
        return self.get(path).json()

    def get_text(self, path: str) -> str:
        reply = self.get(path)
        if not reply.ok:
            raise StatusError(reply.url, reply.status, reply.body)
        return reply.text()

    def post_json(self, path: str, body: Any) -> Any:
        return self.request("POST", path, json_body=body).json()

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def get(url: str, *, key: str | None = None, timeout_s: float | None = DEFAULT_TIMEOUT_S,
        remote_ok: bool = False) -> Reply:
    """One GET of a full URL (any status)."""
    base, path = split_url(url, remote_ok=remote_ok)
    with Client(base, key=key, timeout_s=timeout_s, remote_ok=remote_ok) as client:
        return client.get(path)


def get_json(url: str, *, key: str | None = None, timeout_s: float | None = DEFAULT_TIMEOUT_S,
             remote_ok: bool = False) -> Any:
    return get(url, key=key, timeout_s=timeout_s, remote_ok=remote_ok).json()


def get_text(url: str, *, key: str | None = None, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> str:
    """The body of a 2xx answer to GET `url` (a /metrics scrape)."""
    base, path = split_url(url)
    with Client(base, key=key, timeout_s=timeout_s) as client:
        return client.get_text(path)


def post_json(url: str, body: Any, *, key: str | None = None, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> Any:
    base, path = split_url(url)
    with Client(base, key=key, timeout_s=timeout_s) as client:
        return client.post_json(path, body)


def healthy(url: str, timeout_s: float = 2.0) -> bool:
    """GET `url`/health answers 200 (False for any failure to)."""
    try:
        return get(f"{url.rstrip('/')}/health", timeout_s=timeout_s).status == 200
    except (Unreachable, TimedOut):
        return False


class Stream:
    """A streamed answer: status and headers at once, the body as it arrives."""

    def __init__(self, method: str, url: str, resp: httpx.Response, timeout: httpx.Timeout) -> None:
        self.method, self.url, self._resp, self._timeout = method, url, resp, timeout
        self.status = resp.status_code
        self.headers: Mapping[str, str] = resp.headers

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body in the pieces it arrives in (chunked framing removed), each as soon as read."""
        with _mapped(self.method, self.url, self._timeout):
            async for piece in self._resp.aiter_bytes():
                if piece:
                    yield piece

    async def read(self) -> bytes:
        return b"".join([piece async for piece in self.chunks()])


class AsyncClient(_Base):
    """Asynchronous, keep-alive connections to one base URL (`max_idle` kept open between
    requests, any number at once). Close it with `aclose()` or `async with`."""

    def __init__(self, base: str, *, key: str | None = None, timeout_s: float | None = DEFAULT_TIMEOUT_S,
                 connect_timeout_s: float | None = None, remote_ok: bool = False, max_idle: int = 64,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        super().__init__(base, key, timeout_s, connect_timeout_s, remote_ok)
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=max_idle)
        self.client = httpx.AsyncClient(timeout=self.timeout, trust_env=False, verify=_PLAIN, limits=limits,
                                        transport=transport)

    async def request(self, method: str, path: str, *, json_body: Any = None, content: bytes | None = None,
                      headers: Mapping[str, str] | None = None) -> Reply:
        url = self.url(path)
        with _mapped(method, url, self.timeout):
            resp = await self.client.request(method, url, content=_content(json_body, content),
                                             headers=self.request_headers(headers, json_body is not None))
        return _reply(url, resp)

    async def get(self, path: str) -> Reply:
        return await self.request("GET", path)

    async def get_json(self, path: str) -> Any:
        return (await self.get(path)).json()

    async def get_text(self, path: str) -> str:
        reply = await self.get(path)
        if not reply.ok:
            raise StatusError(reply.url, reply.status, reply.body)
        return reply.text()

    async def post_json(self, path: str, body: Any) -> Any:
        return (await self.request("POST", path, json_body=body)).json()

    @contextlib.asynccontextmanager
    async def stream(self, method: str, path: str, *, json_body: Any = None, content: bytes | None = None,
                     headers: Mapping[str, str] | None = None) -> AsyncIterator[Stream]:
        """The answer once its head is read; the body through `Stream.chunks()`. Leaving the
        block before the body ended closes that connection (it is not reused)."""
        url = self.url(path)
        request = self.client.build_request(method, url, content=_content(json_body, content),
                                            headers=self.request_headers(headers, json_body is not None))
        with _mapped(method, url, self.timeout):
            resp = await self.client.send(request, stream=True)
        try:
            yield Stream(method, url, resp, self.timeout)
        finally:
            await resp.aclose()

    async def aclose(self) -> None:
        await self.client.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
