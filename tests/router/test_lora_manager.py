"""The router's LoRA I/O (`router.lora.manager`) against fake engines (httpx's MockTransport, vLLM's
answers), an injected clock: loads and evictions as the plan says, vLLM's "already loaded" taken as
held, a failed load a 503 that says why, discovery from the engines' /v1/models, one load for
concurrent first requests."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable

import httpx
import pytest

from router.lora.config import LoraConfig
from router.lora.manager import LoraManager, admin
from router.metrics import RouterMetrics
from router.plugins.model import Candidate
from tests.router.conftest import cand
from wire.errors import ApiError

pytestmark = pytest.mark.unit


class FakeEngines:
    """Engines a, b (vLLM's LoRA routes and /v1/models), recording every call."""

    def __init__(self, held: dict[str, list[str]], runtime: bool = True) -> None:
        self.held = {r: list(v) for r, v in held.items()}
        self.runtime = runtime
        self.calls: list[tuple[str, str, str]] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        replica = request.url.path.split("/")[1]  # cand()'s URL: http://127.0.0.1:1/<replica>
        path = request.url.path.removeprefix(f"/{replica}")
        if path == "/v1/models":
            cards = [{"id": "m", "object": "model", "parent": None},
                     *({"id": n, "object": "model", "parent": "m", "root": f"/p/{n}"} for n in self.held[replica])]
            return httpx.Response(200, json={"object": "list", "data": cards})
        if not self.runtime:
            return httpx.Response(404, json={"error": {"message": "Not Found", "type": "Not Found", "code": 404}})
        name = json.loads(request.content)["lora_name"]
        self.calls.append((replica, path, name))
        if path == "/v1/load_lora_adapter":
            if name in self.held[replica]:
                return httpx.Response(400, json={"error": {"message": f"The lora adapter '{name}' has already been "
                                                           "loaded.", "type": "InvalidUserInput", "code": 400}})
            self.held[replica].append(name)
            return httpx.Response(200, text=f"Success: LoRA adapter '{name}' added successfully.")
        self.held[replica].remove(name)
        return httpx.Response(200, text=f"Success: LoRA adapter '{name}' removed successfully.")


def _manager(engines: FakeEngines, clock: Callable[[], float] = lambda: 0.0) -> LoraManager:
    config = LoraConfig.model_validate({"max_loras": 1, "adapters": [
        {"name": n, "path": f"/p/{n}", "base_model": "m"} for n in ("x", "y", "z")]})
    return LoraManager(config, RouterMetrics(), clock=clock, transport=httpx.MockTransport(engines.handle))


def _snapshot() -> list[Candidate]:
    return [cand("a"), cand("b")]


def test_loads_where_there_is_room_then_evicts_the_coldest() -> None:
    engines, now = FakeEngines({"a": [], "b": []}), [0.0]
    m = _manager(engines, lambda: now[0])

    async def main() -> None:
        await m.refresh(_snapshot())
        for name, t in (("x", 1.0), ("y", 2.0)):
            now[0] = t
            await m.ensure(name, _snapshot, sheddable=False)
            m.used(name, m.book.holders(name)[0])
        now[0] = 3.0
        await m.ensure("z", _snapshot, sheddable=False)
        await m.aclose()

    asyncio.run(main())
    assert engines.held == {"a": ["z"], "b": ["y"]}
    assert engines.calls == [("a", "/v1/load_lora_adapter", "x"), ("b", "/v1/load_lora_adapter", "y"),
                             ("a", "/v1/unload_lora_adapter", "x"), ("a", "/v1/load_lora_adapter", "z")]
    assert m.book.holders("z") == ["a"] and m.plans[-1].startswith("load z on a in place of x")


def test_concurrent_first_requests_load_once_and_already_loaded_is_held() -> None:
    engines = FakeEngines({"a": [], "b": ["x"]})
    m = _manager(engines)

    async def main() -> None:  # the router has not read /v1/models yet: b holds x behind its back
        await asyncio.gather(*(m.ensure("x", _snapshot, sheddable=False) for _ in range(5)))
        await m.aclose()

    asyncio.run(main())
    assert engines.calls == [("a", "/v1/load_lora_adapter", "x")]  # one load, for all five
    assert m.book.holders("x") == ["a"]


def test_a_load_the_engine_refuses_is_a_503_that_says_why() -> None:
    m = _manager(FakeEngines({"a": [], "b": []}, runtime=False))

    async def main() -> None:
        try:
            await m.ensure("x", _snapshot, sheddable=False)
        finally:
            await m.aclose()

    with pytest.raises(ApiError) as err:
        asyncio.run(main())
    assert err.value.status == 503 and "VLLM_ALLOW_RUNTIME_LORA_UPDATING" in err.value.message
    assert m.book.holders("x") == []


def test_discovery_and_the_admin_routes() -> None:
    engines = FakeEngines({"a": ["found"], "b": []})
    m = _manager(engines)

    async def main() -> tuple[object, object]:
        await m.refresh(_snapshot())
        assert m.bases()["found"] == "m" and m.adapters["found"].path == "/p/found"
        loaded = await admin(m, "POST", "/admin/lora/load", json.dumps(
            {"lora_name": "new", "lora_path": "/p/new", "replica_id": "b"}).encode(), _snapshot, ["m"])
        gone = await admin(m, "POST", "/admin/lora/unload", b'{"lora_name": "found"}', _snapshot, ["m"])
        await m.aclose()
        return loaded, gone

    loaded, gone = asyncio.run(main())
    assert loaded == {"lora_name": "new", "replica_ids": ["b"], "unloaded": None, "reason": loaded["reason"]}  # type: ignore[index]
    assert gone == {"lora_name": "found", "unloaded_from": ["a"]}
    assert "found" not in m.adapters and engines.held == {"a": [], "b": ["new"]}
    with pytest.raises(ApiError):
        asyncio.run(admin(None, "GET", "/admin/lora", b"", _snapshot, ["m"]))


def test_a_restarted_engine_holds_nothing_until_it_loads_again() -> None:
    engines = FakeEngines({"a": ["x"], "b": []})
    m = _manager(engines)
    moved = [cand("a"), cand("b")]
    moved[0] = moved[0]._replace(endpoint=dataclasses.replace(moved[0].endpoint, url="http://127.0.0.1:2/a"))

    async def main() -> None:
        await m.refresh(_snapshot())
        assert not m.needs_load("x", _snapshot(), sheddable=False)
        engines.held["a"] = []  # it restarted on another port: nothing loaded there any more
        assert m.needs_load("x", moved, sheddable=False) and m.holders("x", moved) == []
        await m.ensure("x", lambda: moved, sheddable=False)
        await m.aclose()

    asyncio.run(main())
    assert engines.calls == [("a", "/v1/load_lora_adapter", "x")]
    assert [c.endpoint.url for c in m.holders("x", moved)] == ["http://127.0.0.1:2/a"]


def test_an_adapter_being_unloaded_is_not_routed_to() -> None:
    """One replica, max_loras 1, x held: loading y evicts x; a request for x during that unload
    must wait and load x again, not be sent to a replica whose x is going."""
    engines = FakeEngines({"a": ["x"]})
    gate = asyncio.Event()

    async def slow(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/v1/unload_lora_adapter"):
            await gate.wait()
        return engines.handle(request)

    config = LoraConfig.model_validate({"max_loras": 1, "adapters": [
        {"name": n, "path": f"/p/{n}", "base_model": "m"} for n in ("x", "y")]})
    m = LoraManager(config, RouterMetrics(), clock=lambda: 0.0, transport=httpx.MockTransport(slow))
    one = [cand("a")]

    async def main() -> list[str]:
        await m.refresh(one)
        loading_y = asyncio.create_task(m.ensure("y", lambda: one, sheddable=False))
        for _ in range(1000):  # until y's load is waiting on x's unload
            await asyncio.sleep(0)
        assert not loading_y.done() and m.book.holders("y") == []
        assert m.needs_load("x", one, False) and m.holders("x", one) == []  # x is leaving: nobody is sent to it
        wanting_x = asyncio.create_task(m.ensure("x", lambda: one, sheddable=False))
        gate.set()
        await asyncio.gather(loading_y, wanting_x)
        await m.aclose()
        return engines.held["a"]

    assert asyncio.run(main()) == ["x"]  # y was loaded, then evicted again for x; x is there when its request goes
