"""The per-request cost bound (router/cost.py, issue 28): a request is priced from its body before
routing (sequences, tokens, logprob entries, response bytes), refused with a 400 naming the limit
it is over, and a chat without max_tokens is sent on with the router's limit as max_tokens."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from pools.model import SLOClass
from router.call import Call, read_call
from router.cost import COMPLETION_DEFAULT_MAX_TOKENS, CostLimits, check, measure
from wire.errors import ApiError
from wire.prompt import read_prompts

pytestmark = pytest.mark.unit
BATCH = SLOClass(name="batch", priority=2, ttft_ms=30000, tpot_ms=500, sheddable=True)
LIMITS = CostLimits(default_max_tokens=4096)
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]


def _read(body: dict[str, Any], path: str = CHAT, limits: CostLimits | None = LIMITS,
          declared: frozenset[tuple[str, str]] = frozenset()) -> Call:
    return read_call(json.dumps(body).encode(), path, BATCH, max_body_bytes=1 << 20, max_tokens_limit=4096,
                     mixed=frozenset({"m"}), limits=limits, seq_share=0.5, declared=declared, tenant="t")


# (body, path, the cause of the 400 or None when it passes)
CASES: list[tuple[dict[str, Any], str, str | None]] = [
    ({"messages": MSG, "max_tokens": 100}, CHAT, None),
    ({"messages": MSG, "n": 64, "max_tokens": 100}, CHAT, None),
    ({"messages": MSG, "n": 65, "max_tokens": 100}, CHAT, "sequences"),
    ({"messages": MSG, "n": 256, "max_tokens": 4096}, CHAT, "sequences"),  # the attack
    ({"messages": MSG, "n": 256}, CHAT, "sequences"),
    ({"prompt": ["a"] * 16, "n": 5, "max_tokens": 10}, COMPLETIONS, "sequences"),  # 16 prompts x n=5 = 80
    ({"prompt": [[1, 2, 3]] * 64, "max_tokens": 10}, COMPLETIONS, None),
    ({"prompt": "x", "n": 64, "max_tokens": 4096}, COMPLETIONS, None),  # 64 x 4097 tokens < 1 Mi
    ({"prompt": "x", "logprobs": 20, "max_tokens": 4096}, COMPLETIONS, None),  # 4096 x 21 entries
    ({"prompt": "x", "n": 4, "logprobs": 20, "max_tokens": 4096}, COMPLETIONS, "logprobs"),  # 344,064 entries
    ({"messages": MSG, "logprobs": True, "top_logprobs": 20, "n": 4}, CHAT, "logprobs"),  # max_tokens omitted
    ({"messages": MSG, "logprobs": False, "top_logprobs": 20, "n": 4}, CHAT, None),
    ({"prompt": "x", "n": 60, "max_tokens": 4096, "stream": True}, COMPLETIONS, "response_bytes"),
    ({"prompt": "x", "n": 40, "max_tokens": 4096, "stream": True}, COMPLETIONS, None),
]


@pytest.mark.parametrize(("body", "path", "cause"), CASES)
def test_the_cost_bound(body: dict[str, Any], path: str, cause: str | None) -> None:
    body = {"model": "m", **body}
    if cause is None:
        _read(body, path)
        return
    with pytest.raises(ApiError) as err:
        _read(body, path)
    assert (err.value.status, err.value.cause) == (400, cause)
    assert "limit" in err.value.message and err.value.param is not None
    assert json.loads(err.value.body())["error"]["code"] == 400  # OpenAI's shape


def test_the_token_bound_counts_prompts_and_max_tokens_per_sequence() -> None:
    limits = CostLimits(max_request_tokens=8_500, default_max_tokens=4096)
    body = {"model": "m", "prompt": ["word " * 100] * 4, "n": 2, "max_tokens": 1000}
    cost = measure(body, read_prompts(body), chat=False, stream=False, default_max_tokens=4096)
    assert cost.sequences == 8
    assert cost.tokens == 2 * sum(p.tokens for p in read_prompts(body)) + 8 * 1000
    with pytest.raises(ApiError, match="limit of 8500") as err:
        check(cost, limits)
    assert err.value.cause == "request_tokens"


@pytest.mark.parametrize(("extra", "path", "sent"), [
    ({}, CHAT, 4096),  # omitted: the router's limit, not the model's context
    ({"max_tokens": None}, CHAT, 4096),
    ({"max_completion_tokens": None}, CHAT, 4096),
    ({"max_tokens": 7}, CHAT, 7),
    ({"max_completion_tokens": 9}, CHAT, None),  # the client's own field goes on as it is
    ({"max_tokens": "ten"}, CHAT, "ten"),  # not a number: the engine's 400 names it
    ({"max_tokens": 1.5}, CHAT, 1.5),
    ({}, COMPLETIONS, None),  # the completions API's default (16) applies
    ({"max_tokens": None}, COMPLETIONS, 4096),  # null: up to the context, so the router's limit
])
def test_max_tokens_omitted_is_sent_as_the_routers_limit(extra: dict[str, Any], path: str, sent: object) -> None:
    prompt = {"messages": MSG} if path == CHAT else {"prompt": "hi"}
    call = _read({"model": "m", **prompt, **extra}, path)
    payload = orjson.loads(call.payload)
    assert payload.get("max_tokens") == sent
    assert payload["priority"] == BATCH.priority  # vLLM's priority scheduling: forwarded
    assert call.cost is not None
    if path == COMPLETIONS and "max_tokens" not in extra:
        assert call.cost.max_tokens == COMPLETION_DEFAULT_MAX_TOKENS


def test_the_default_is_never_above_the_routers_limit() -> None:
    call = read_call(json.dumps({"model": "m", "messages": MSG}).encode(), CHAT, BATCH, max_body_bytes=1 << 20,
                     max_tokens_limit=100, mixed=frozenset({"m"}), limits=CostLimits(default_max_tokens=32768))
    assert orjson.loads(call.payload)["max_tokens"] == 100


def test_routing_learns_the_sequences_the_share_and_whether_any_pool_may_serve() -> None:
    call = _read({"model": "m", "prompt": ["a", "b"], "n": 3, "max_tokens": 5}, COMPLETIONS,
                 declared=frozenset({("m", "interactive")}))
    assert (call.route.seqs, call.route.seq_share, call.route.any_pool, call.tenant) == (6, 0.5, True, "t")
    assert not _read({"model": "m", "messages": MSG}, declared=frozenset({("m", "batch")})).route.any_pool
    assert not _read({"model": "m", "messages": MSG}, declared=frozenset({("m", "*")})).route.any_pool


def test_without_limits_nothing_is_bounded_or_added() -> None:
    call = _read({"model": "m", "messages": MSG, "n": 1000}, limits=None)
    assert call.cost is None and call.route.seqs == 1000
    assert "max_tokens" not in orjson.loads(call.payload)


def test_a_huge_prompt_list_is_refused_before_any_prompt_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch key's one request with a million one-token prompts (4 MiB) held the router's event
    loop for 2-3 s while every prompt was read, only to be refused for its count: the count comes
    from the list's length first."""
    def never(body: dict[str, Any]) -> Any:
        raise AssertionError("the prompts were read")

    monkeypatch.setattr("router.call.read_prompts", never)
    for prompt in (["a"] * 200_000, [[1]] * 200_000):
        with pytest.raises(ApiError) as err:
            read_call(orjson.dumps({"model": "m", "prompt": prompt, "max_tokens": 1}), COMPLETIONS, BATCH,
                      max_body_bytes=4 << 20, max_tokens_limit=4096, mixed=frozenset({"m"}), limits=LIMITS)
        assert err.value.status == 400 and err.value.cause == "sequences" and "200000 sequences" in str(err.value)


def test_a_body_of_a_million_tiny_arrays_is_refused_before_it_is_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parsing allocates one object per JSON array or object: 4 MiB of `[1],` is a million lists.
    Such a body is refused on a byte count; a long prompt of text with brackets is not."""
    def never(raw: bytes) -> Any:
        raise AssertionError("the body was parsed")

    bomb = orjson.dumps({"model": "m", "prompt": [[1]] * 1_000_000, "max_tokens": 1})
    with monkeypatch.context() as patched:
        patched.setattr("router.call.wire.load_body", never)
        with pytest.raises(ApiError) as err:
            read_call(bomb, COMPLETIONS, BATCH, max_body_bytes=8 << 20, max_tokens_limit=4096,
                      mixed=frozenset({"m"}), limits=LIMITS)
    assert err.value.status == 400 and "JSON arrays and objects" in str(err.value)
    code = "def f(xs): return [x[0] for x in xs if {x[1]}]\n" * 20_000  # ~1 MB, 60,000 brackets
    call = read_call(orjson.dumps({"model": "m", "prompt": code, "max_tokens": 1}), COMPLETIONS, BATCH,
                     max_body_bytes=8 << 20, max_tokens_limit=4096, mixed=frozenset({"m"}), limits=LIMITS)
    assert call.cost is not None and call.cost.sequences == 1
