"""What a replica's context can hold (router/plugins/filters.py `fits_context`, router/call.py
`context_tokens`), as plain values: the context-filter in the default profile and in the PD legs,
and the 400 in vLLM's words only where the model's largest context cannot serve."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from router.call import read_call
from router.cost import CostLimits
from router.decision import decide
from router.plugins.filters import usable_of
from router.plugins.model import ReplicaLoad
from router.plugins.profile import Profile
from tests.router.conftest import STANDARD, cand, req
from wire.errors import ApiError

pytestmark = pytest.mark.unit
SMALL, LARGE = 27008, 131072
SNAPSHOT = [cand("rtx", load=ReplicaLoad(context=SMALL)), cand("h100", load=ReplicaLoad(context=LARGE, waiting=9)),
            cand("new")]  # "new": its engine has not said its context yet


@pytest.mark.parametrize(("need", "kept"), [(100, {"rtx", "h100", "new"}), (SMALL, {"rtx", "h100", "new"}),
                                            (SMALL + 1, {"h100", "new"}), (30_000, {"h100", "new"})])
def test_the_default_profile_keeps_the_replicas_whose_context_holds_the_request(need: int, kept: set[str]) -> None:
    r = req()._replace(context_tokens=need)
    assert {c.endpoint.replica_id for c in usable_of(r, SNAPSHOT, "mixed")} == kept
    decision = decide(r, SNAPSHOT, Profile(), random.Random(0))
    assert decision.winner is not None and decision.winner.endpoint.replica_id in kept
    filtered = Profile(filters=("health-filter", "context-filter"))  # the plugin by its name
    assert {x.replica_id for x in decide(r, SNAPSHOT, filtered, random.Random(0)).ranked} == kept


def test_a_prefill_leg_needs_its_prompt_and_one_token() -> None:
    prefill = cand("p", role="prefill", load=ReplicaLoad(context=SMALL))
    decode = cand("d", role="decode", load=ReplicaLoad(context=SMALL))
    r = req(tokens=20_000)._replace(context_tokens=20_000 + 10_000)
    assert usable_of(r, [prefill, decode], "prefill") == [prefill]  # 20,001 fits the prefill's context
    assert usable_of(r, [prefill, decode], "decode") == []  # the decode must hold 30,000: no PD pair here


def _read(body: dict[str, Any], path: str = "/v1/chat/completions", largest: int = LARGE,
          limits: CostLimits | None = None) -> Any:
    return read_call(json.dumps(body).encode(), path, STANDARD, max_body_bytes=1 << 22, max_tokens_limit=32768,
                     mixed=frozenset({"m"}), limits=limits, contexts={"m": SMALL}, largest={"m": largest})


HI = [{"role": "user", "content": "hi"}]


def test_what_a_request_needs_is_its_prompt_and_max_tokens_at_most_the_largest_context() -> None:
    asked = _read({"model": "m", "messages": HI, "max_tokens": 29951}).route
    assert asked.context_tokens == asked.prompt_tokens + 29951
    # no max_tokens: the router sends its default (within the smallest context); the request takes what is left
    defaulted = _read({"model": "m", "messages": HI}, limits=CostLimits())
    assert defaulted.route.context_tokens == defaulted.route.prompt_tokens
    assert json.loads(defaulted.payload)["max_tokens"] == SMALL
    cut = _read({"model": "m", "input": "hi", "max_output_tokens": 32000}, "/v1/responses", largest=SMALL).route
    assert cut.context_tokens == SMALL  # vLLM cuts the Responses API's max_output_tokens to fit
    assert _read({"model": "m", "messages": HI, "max_tokens": 29951}, largest=0).route.context_tokens > 29951


def test_only_what_the_largest_context_cannot_serve_is_refused_in_vllms_words() -> None:
    with pytest.raises(ApiError) as err:
        _read({"model": "m", "messages": HI, "max_completion_tokens": 29951}, largest=SMALL)
    assert (err.value.status, err.value.kind, err.value.param) == (400, "BadRequestError", "max_completion_tokens")
    assert err.value.message.startswith(f"max_completion_tokens=29951 cannot be greater than max_model_len={SMALL}")
    with pytest.raises(ApiError) as err:
        _read({"model": "m", "prompt": "x" * (4 * SMALL + 8), "max_tokens": 1}, "/v1/completions", largest=SMALL)
    assert err.value.param == "input_tokens" and f"maximum context length is {SMALL} tokens" in err.value.message
