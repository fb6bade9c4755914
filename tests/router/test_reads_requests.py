"""How the router reads a generation request before routing it (router/call.py): numbers as the
engine reads them (vLLM's lax pydantic: 2.0 and "2" are 2), so a request the engine serves as
several sequences is never split over PD, and the router's token limit cannot be slipped past
with a float."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pools.model import SLOClass
from router.call import read_call
from wire.errors import ApiError

pytestmark = pytest.mark.unit
SLO = SLOClass(name="standard", priority=1, ttft_ms=2000, tpot_ms=100)


def _read(body: dict[str, Any], mixed: frozenset[str] = frozenset({"m"})) -> Any:
    return read_call(json.dumps(body).encode(), "/v1/chat/completions", SLO, max_body_bytes=1 << 20,
                     max_tokens_limit=4096, mixed=mixed)


@pytest.mark.parametrize("n", [2, 2.0, "2"])
def test_several_sequences_however_n_is_written(n: Any) -> None:
    call = _read({"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": n})
    assert call.many
    assert call.route.role is None  # a model with mixed replicas serves it whole there
    assert _read({"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": n},
                 mixed=frozenset()).route.role == "decode"


@pytest.mark.parametrize("n", [1, 1.0, None])
def test_one_sequence(n: Any) -> None:
    assert not _read({"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": n}).many


@pytest.mark.parametrize("key", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("value", [5000, 5000.0, "5000", 1e9])
def test_the_token_limit_holds_for_every_way_of_writing_the_number(key: str, value: Any) -> None:
    with pytest.raises(ApiError) as err:
        _read({"model": "m", "messages": [{"role": "user", "content": "hi"}], key: value})
    assert err.value.status == 400 and err.value.param == key


def test_the_body_for_the_engine_has_the_routers_fields_only() -> None:
    call = _read({"model": "m", "messages": [{"role": "user", "content": "x" * 300}],
                  "kv_transfer_params": {"do_remote_prefill": True}})
    sent = json.loads(call.payload)
    assert "kv_transfer_params" not in sent and sent["priority"] == SLO.priority
    assert call.route.prompt_tokens > 0 and call.route.prefix_hash != 0
