"""LoRA adapters on a simulated engine started as a user starts it (`--enable-lora`,
`--lora-modules`, `VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`), spoken to as vLLM 0.32 is: the official
openai client for generation and the model list, plain JSON for vLLM's load and unload routes,
whose answers (plain-text success, errors in vLLM's shape and words) are checked."""

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

pytestmark = pytest.mark.integration
MODEL = "llama-3.1-8b"


def _post(base: str, path: str, body: dict[str, Any]) -> tuple[int, bytes, str]:
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read(), resp.headers.get("content-type", "")
    except urllib.error.HTTPError as err:
        return err.code, err.read(), err.headers.get("content-type", "")


@pytest.fixture(scope="module")
def lora_engine() -> Iterator[EngineProcess]:
    mp = pytest.MonkeyPatch()
    mp.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "true")
    try:
        with running_engine("--model", MODEL, "--gpu", "h100-sxm", "--time-scale", "0.05", "--enable-lora",
                            "--max-loras", "2", "--enable-prefix-caching",
                            "--lora-modules", "sql=/adapters/sql", '{"name": "chat", "path": "/adapters/chat"}') as e:
            yield e
    finally:
        mp.undo()


def test_models_lists_adapters_as_vllm_does(lora_engine: EngineProcess) -> None:
    client = openai_client(lora_engine.url, "none")
    try:
        cards = {m.id: m for m in client.models.list().data}
    finally:
        client.close()
    assert list(cards) == [MODEL, "sql", "chat"]
    sql = cards["sql"].model_dump()
    assert (sql["root"], sql["parent"], sql["owned_by"]) == ("/adapters/sql", MODEL, "vllm")
    assert cards[MODEL].model_dump()["parent"] is None


def test_a_request_names_an_adapter(lora_engine: EngineProcess) -> None:
    client = openai_client(lora_engine.url, "none")
    try:
        out = client.chat.completions.create(model="sql", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        assert out.model == "sql" and out.usage is not None and out.usage.completion_tokens == 3
        with urllib.request.urlopen(lora_engine.base + "/metrics", timeout=10) as resp:
            info = [x for x in resp.read().decode().splitlines() if x.startswith("vllm:lora_requests_info{")]
        assert any('max_lora="2"' in x and 'running_lora_adapters="sql"' in x for x in info), info
        with pytest.raises(openai.NotFoundError) as err:
            client.completions.create(model="nosuch", prompt="hi", max_tokens=2)
        assert err.value.body == {"message": f"The model `nosuch` does not exist. Valid aliases: {MODEL}.",
                                  "type": "NotFoundError", "param": "model", "code": 404}
    finally:
        client.close()


def test_load_and_unload_at_run_time(lora_engine: EngineProcess) -> None:
    base = lora_engine.base
    status, body, kind = _post(base, "/v1/load_lora_adapter", {"lora_name": "math", "lora_path": "/adapters/math"})
    assert (status, body) == (200, b"Success: LoRA adapter 'math' added successfully.") and kind.startswith("text/")
    status, body, _ = _post(base, "/v1/load_lora_adapter", {"lora_name": "math", "lora_path": "/adapters/math"})
    assert status == 400 and json.loads(body)["error"]["type"] == "InvalidUserInput"
    assert "has already been loaded" in json.loads(body)["error"]["message"]
    status, body, _ = _post(base, "/v1/load_lora_adapter", {"lora_name": MODEL, "lora_path": "/x"})
    assert status == 400 and "conflicts with a served base model" in json.loads(body)["error"]["message"]
    status, body, _ = _post(base, "/v1/load_lora_adapter", {"lora_name": "x"})
    assert status == 400  # lora_path is required (pydantic's 400 in vLLM; here vLLM's own check)
    client = openai_client(lora_engine.url, "none")
    try:
        assert client.completions.create(model="math", prompt="1+1", max_tokens=2).model == "math"
        status, body, _ = _post(base, "/v1/unload_lora_adapter", {"lora_name": "math"})
        assert (status, body) == (200, b"Success: LoRA adapter 'math' removed successfully.")
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="math", prompt="1+1", max_tokens=2)
    finally:
        client.close()
    status, body, _ = _post(base, "/v1/unload_lora_adapter", {"lora_name": "math"})
    assert status == 404 and json.loads(body)["error"] == {
        "message": "The lora adapter 'math' cannot be found.", "type": "NotFoundError", "param": None, "code": 404}


def test_routes_are_gated_as_vllm_gates_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", raising=False)
    with running_engine("--model", MODEL, "--gpu", "h100-sxm", "--enable-lora") as engine:
        status, _, _ = _post(engine.base, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "/a"})
        assert status == 404  # without VLLM_ALLOW_RUNTIME_LORA_UPDATING the route does not exist
    with running_engine("--model", MODEL, "--gpu", "h100-sxm", "--enable-lora",
                        "--allow-runtime-lora-updating") as engine:  # the variable's stand-in, for launchers
        status, _, _ = _post(engine.base, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "/a"})
        assert status == 200
