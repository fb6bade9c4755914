"""The router's LoRA I/O: loading and unloading adapters on engines as the pure plan says
(`router.lora.placement`), through vLLM's own routes (POST /v1/load_lora_adapter {lora_name,
lora_path}, POST /v1/unload_lora_adapter {lora_name}; the engines need
VLLM_ALLOW_RUNTIME_LORA_UPDATING).

- The adapters requests may name: the config's (`lora.adapters`), those loaded through the admin
  route, and, with `lora.discover`, those the engines say they hold (their /v1/models: a card
  with a `parent`), read every `lora.refresh_s`.
- One plan and its loads at a time (a lock): concurrent first requests of an adapter wait for the
  one load and find it held; two adapters never race for one replica's last slot.
- An engine that answers "already loaded" holds it (another router worker loaded it); an unload
  that finds nothing there is done.
- Metrics: isle_router_lora_loads{replica, outcome}, isle_router_lora_unloads{replica, reason},
  isle_router_lora_load_seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import httpx
import orjson

from router.lora.config import LoraConfig
from router.lora.placement import AdapterBook, LoraPlan, base_candidates, place
from router.metrics import RouterMetrics
from router.plugins.model import Candidate
from wire.client import AsyncClient, ClientError
from wire.errors import ApiError
from wire.openai import load_body

log = logging.getLogger("isleserve.router.lora")
Snapshot = Callable[[], list[Candidate]]


@dataclass(frozen=True, slots=True)
class Adapter:
    name: str
    path: str
    base: str
    source: str
    """config, admin or engine (discovered)."""


class LoraManager:
    def __init__(self, config: LoraConfig, metrics: RouterMetrics, engine_key: str = "",
                 clock: Callable[[], float] = time.monotonic,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        """`transport`: the engines' HTTP (tests give a fake engine; None: the network)."""
        self.config, self.metrics, self.key, self.clock = config, metrics, engine_key or None, clock
        self.transport = transport
        self.adapters = {a.name: Adapter(a.name, a.path, a.base_model, "config") for a in config.adapters}
        self.book = AdapterBook()
        self._lock = asyncio.Lock()
        self._clients: dict[str, AsyncClient] = {}
        self._urls: dict[str, str] = {}
        self._bases: dict[str, str] | None = None
        """`bases()`, until the adapters change (every change sets it to None)."""
        """Replica id -> the engine URL its holdings were learnt from."""
        self._changes = 0
        """Loads and unloads so far: a refresh read before one of them is not applied."""
        self.plans: list[str] = []
        """The last plans' reasons (the admin view)."""

    # what the request path reads (synchronous, cheap)
    def bases(self) -> Mapping[str, str]:
        """Adapter -> its base model (`router.call.read_call`; rebuilt only when the adapters changed)."""
        if self._bases is None:
            self._bases = {name: a.base for name, a in self.adapters.items()}
        return self._bases

    def holders(self, adapter: str, snapshot: Sequence[Candidate]) -> list[Candidate]:
        held = set(self.book.holders(adapter))
        return [c for c in snapshot if c.endpoint.replica_id in held and self._same_engine(c)]

    def needs_load(self, adapter: str, snapshot: Sequence[Candidate], sheddable: bool) -> bool:
        a = self.adapters.get(adapter)
        return a is None or not any(adapter in self.book.on(c.endpoint.replica_id) and self._same_engine(c)
                                    for c in base_candidates(snapshot, a.base, sheddable))

    def _same_engine(self, c: Candidate) -> bool:
        """The replica runs on the engine the book learnt it from (a restart moves it to a new URL)."""
        return self._urls.get(c.endpoint.replica_id, c.endpoint.url) == c.endpoint.url

    def _forget_moved(self, cands: Sequence[Candidate]) -> None:
        """A replica on a new engine (restarted, moved) holds nothing the book said of the old one."""
        for c in cands:
            rid = c.endpoint.replica_id
            if not self._same_engine(c):
                self.book.learn(rid, [])
            self._urls[rid] = c.endpoint.url

    def used(self, adapter: str, replica: str) -> None:
        self.book.used(replica, adapter, self.clock())

    def cards(self) -> list[dict[str, Any]]:
        """The adapters as vLLM's /v1/models lists them (after the base models)."""
        return [{"id": a.name, "object": "model", "created": 0, "owned_by": "isleserve", "root": a.path,
                 "parent": a.base} for a in self.adapters.values()]

    def view(self) -> dict[str, Any]:
        """GET /admin/lora."""
        return {"max_loras": self.config.max_loras,
                "adapters": [{"name": a.name, "path": a.path, "base_model": a.base, "source": a.source,
                              "replicas": self.book.holders(a.name)} for a in self.adapters.values()],
                "replicas": {r: dict(sorted(names.items())) for r, names in sorted(self.book.held.items())},
                "plans": list(self.plans)}

    # loading
    async def ensure(self, adapter: str, snapshot: Snapshot, sheddable: bool) -> None:
        """Until a usable replica holds `adapter` (503 when none can)."""
        a = self.adapters.get(adapter)
        if a is None:
            raise ApiError(404, f"The model `{adapter}` does not exist.", "NotFoundError", "model")
        if not self.needs_load(adapter, snapshot(), sheddable):
            return  # held: no wait behind another adapter's load
        async with self._lock:
            cands = base_candidates(snapshot(), a.base, sheddable)
            self._forget_moved(cands)
            plan = place(adapter, cands, self.book, self.config.max_loras)
            if plan.kind != "held":
                await self._carry_out(a, plan, cands)

    async def _carry_out(self, a: Adapter, plan: LoraPlan, cands: Sequence[Candidate]) -> None:
        self._note(plan)
        if plan.kind == "none":
            raise ApiError(503, f"adapter {a.name}: {plan.reason}", "service_unavailable", cause="lora_unplaced")
        rid = plan.replicas[0]
        url = next(c.endpoint.url for c in cands if c.endpoint.replica_id == rid)
        if plan.evict is not None:
            await self._unload(rid, url, plan.evict, "evicted")
        await self._load(rid, url, a)

    async def _load(self, rid: str, url: str, a: Adapter) -> None:
        t0 = self.clock()
        status, message = await self._post(url, "/v1/load_lora_adapter", {"lora_name": a.name, "lora_path": a.path})
        ok = status == 200 or (status == 400 and "already been loaded" in message)
        m = self.metrics
        m.child(m.lora_loads, rid, "loaded" if ok else "failed").inc()
        if not ok:
            raise ApiError(503, f"loading adapter {a.name} on replica {rid} failed: {status} {message}",
                           "service_unavailable", cause="lora_load_failed")
        m.lora_load_seconds.observe(self.clock() - t0)
        self.book.loaded(rid, a.name, self.clock())
        self._changes += 1
        log.info("adapter %s loaded on %s in %.3f s", a.name, rid, self.clock() - t0)

    async def _unload(self, rid: str, url: str, name: str, reason: str) -> None:
        last = self.book.held.get(rid, {}).get(name)
        self.book.unloaded(rid, name)  # leaving: a request that comes meanwhile waits for the lock, not for a 404
        status, message = await self._post(url, "/v1/unload_lora_adapter", {"lora_name": name})
        if status not in (200, 404):  # 404: not there (any more): unloaded all the same
            if last is not None:
                self.book.loaded(rid, name, last)  # still there
            raise ApiError(503, f"unloading adapter {name} from replica {rid} failed: {status} {message}",
                           "service_unavailable", cause="lora_unload_failed")
        self._changes += 1
        self.metrics.child(self.metrics.lora_unloads, rid, reason).inc()
        log.info("adapter %s unloaded from %s (%s)", name, rid, reason)

    async def _post(self, url: str, path: str, body: dict[str, Any]) -> tuple[int, str]:
        """(status, error message or body text); 0 when the engine did not answer."""
        client = self._client(url)
        try:
            reply = await client.request("POST", path, json_body=body)
        except ClientError as err:
            return 0, str(err)
        text = reply.text()
        if not reply.ok:  # vLLM's error shape: its message
            with contextlib.suppress(ValueError, TypeError, KeyError):
                text = str(orjson.loads(reply.body)["error"]["message"])
        if reply.status == 404 and text == "Not Found":
            text = "the engine serves no LoRA load route (start it with VLLM_ALLOW_RUNTIME_LORA_UPDATING=1)"
        return reply.status, text

    def _client(self, url: str) -> AsyncClient:
        client = self._clients.get(url)
        if client is None:
            client = self._clients[url] = AsyncClient(url, key=self.key, timeout_s=self.config.load_timeout_s,
                                                      max_idle=1, transport=self.transport)
        return client

    def _note(self, plan: LoraPlan) -> None:
        log.debug("lora plan: %s", plan.reason)
        self.plans = [*self.plans[-15:], plan.reason]

    # admin
    async def admin_load(self, body: Mapping[str, Any], snapshot: Snapshot, served: Sequence[str]) -> dict[str, Any]:
        """POST /admin/lora/load {lora_name, lora_path, base_model?, replica_id?}: known from now on,
        and loaded now (on `replica_id`, unloading its coldest when full, or where a request's
        first load would go)."""
        name, path, base, rid = (body.get(k) for k in ("lora_name", "lora_path", "base_model", "replica_id"))
        known = self.adapters.get(str(name))
        base = base or (known.base if known is not None else served[0] if len(served) == 1 else None)
        path = path or (known.path if known is not None else None)
        if not isinstance(name, str) or not name or not isinstance(path, str) or not isinstance(base, str):
            raise ApiError(400, "want {lora_name, lora_path, base_model (where several models are served), "
                           "replica_id (optional)}")
        if base not in served or name in served:
            raise ApiError(400, f"base_model {base!r} is not a served model" if base not in served
                           else f"{name} is a served base model")
        a = self.adapters[name] = Adapter(name, path, base, known.source if known is not None else "admin")
        self._bases = None
        async with self._lock:
            cands = base_candidates(snapshot(), base, True)
            self._forget_moved(cands)
            if rid is not None:
                cands = [c for c in cands if c.endpoint.replica_id == rid]
                if not cands:
                    raise ApiError(400, f"replica {rid} is not a usable replica of {base}")
            plan = place(name, cands, self.book, self.config.max_loras)
            if plan.kind != "held":
                await self._carry_out(a, plan, cands)
        return {"lora_name": name, "replica_ids": self.book.holders(name), "unloaded": plan.evict,
                "reason": plan.reason}

    async def admin_unload(self, body: Mapping[str, Any], snapshot: Snapshot) -> dict[str, Any]:
        """POST /admin/lora/unload {lora_name, replica_id?}: off that replica, or off every replica
        (then forgotten unless the config declares it)."""
        name, rid = body.get("lora_name"), body.get("replica_id")
        if not isinstance(name, str) or name not in self.adapters:
            raise ApiError(404, f"no adapter {name!r}", "not_found_error")
        urls = {c.endpoint.replica_id: c.endpoint.url for c in snapshot()}
        done = []
        async with self._lock:
            for holder in self.book.holders(name):
                if (rid is None or holder == rid) and holder in urls:
                    await self._unload(holder, urls[holder], name, "admin")
                    done.append(holder)
            if rid is None and self.adapters[name].source != "config":
                del self.adapters[name]
                self._bases = None
        return {"lora_name": name, "unloaded_from": done}

    # discovery
    async def refresh_forever(self, snapshot: Snapshot) -> None:
        try:
            while True:
                await self.refresh(snapshot())
                await asyncio.sleep(self.config.refresh_s)
        finally:
            await self.aclose()

    async def refresh(self, cands: Sequence[Candidate]) -> None:
        """What each engine holds, from its /v1/models (a failed read changes nothing)."""
        changes = self._changes
        found: dict[str, tuple[str, list[tuple[str, str]]]] = {}
        for c in cands:
            with contextlib.suppress(ClientError, ValueError, TypeError, KeyError):
                data = (await self._client(c.endpoint.url).get_json("/v1/models"))["data"]
                found[c.endpoint.replica_id] = (c.endpoint.model, [(str(d["id"]), str(d.get("root") or d["id"]))
                                                                   for d in data if d.get("parent")])
        if changes != self._changes or self._lock.locked():
            return  # a load or unload since: the next refresh reads it
        self.book.keep(c.endpoint.replica_id for c in cands)
        self._forget_moved(cands)
        for rid, (base, held) in found.items():
            self.book.learn(rid, [name for name, _ in held])
            for name, root in held:
                if self.config.discover and name not in self.adapters:
                    self.adapters[name] = Adapter(name, root, base, "engine")
                    self._bases = None
        everywhere = {n for names in self.book.held.values() for n in names}
        for name in [n for n, a in self.adapters.items() if a.source == "engine" and n not in everywhere]:
            del self.adapters[name]
            self._bases = None

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            with contextlib.suppress(Exception):
                await client.aclose()


ADMIN_PATHS = frozenset({"/admin/lora", "/admin/lora/load", "/admin/lora/unload"})


async def admin(manager: LoraManager | None, method: str, path: str, raw: bytes, snapshot: Snapshot,
                served: Sequence[str]) -> dict[str, Any]:
    """The admin routes (behind the admin key): GET /admin/lora (adapters, who holds them, the last
    plans), POST /admin/lora/load, POST /admin/lora/unload."""
    if manager is None:
        raise ApiError(404, "LoRA adapters are not configured (router config `lora`)", "not_found_error")
    if method in ("GET", "HEAD"):
        return manager.view()
    body = load_body(raw)
    if path == "/admin/lora/load":
        return await manager.admin_load(body, snapshot, served)
    return await manager.admin_unload(body, snapshot)


def card_body(manager: LoraManager | None, path: str) -> bytes | None:
    """`GET /v1/models/{id}` of an adapter: its card as /v1/models lists it (None: not an adapter)."""
    if manager is None:
        return None
    name = unquote(path.removeprefix("/v1/models/"))
    found = next((c for c in manager.cards() if c["id"] == name), None)
    return orjson.dumps(found) if found is not None else None
