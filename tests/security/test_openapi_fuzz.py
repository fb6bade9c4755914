"""schemathesis against the router's own OpenAPI document (`/openapi.json`), on loopback in front
of simulated engines: valid and invalid requests generated from the document for every
operation. Never a 5xx, every error in OpenAI's shape, every answer within a deadline, answers
as documented. Bounded: a few examples per operation, derandomized, so CI time stays small."""

from __future__ import annotations

import json
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis import GenerationMode
from schemathesis.checks import CHECKS, load_all_checks

from router.routes import served_document
from tests.security.conftest import MAX_TOKENS_LIMIT, MODEL, USER_KEY, Deployment, call

pytestmark = pytest.mark.integration
DOC = json.loads(served_document(["interactive", "standard", "batch"], MAX_TOKENS_LIMIT))
"""As the test deployment serves it: its SLO classes are the `x-slo-class` values."""
schema = schemathesis.openapi.from_dict(DOC)
schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE], max_examples=12)
CALL_TIMEOUT_S = 15.0


load_all_checks()
ALL_CHECKS: list[schemathesis.CheckFunction] = [c for c in CHECKS.get_all() if not isinstance(c, type)]
"""Every check schemathesis has: server errors, status codes, content types, headers, response
schemas, negative data rejected and positive data accepted, missing required headers,
unsupported methods (405 + Allow), ignored auth, ..."""


def test_the_router_serves_the_document(deployment: Deployment) -> None:
    status, headers, body = call(deployment.base + "/openapi.json", key=None)
    assert status == 200 and headers["content-type"].startswith("application/json")
    assert json.loads(body) == DOC
    documented = set(DOC["paths"])
    assert documented >= {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics",
                          "/admin/replicas", "/admin/topology", "/admin/plan"}


@schema.parametrize()
@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
def test_generated_requests(case: schemathesis.Case[Any], deployment: Deployment) -> None:
    if isinstance(case.body, dict) and "model" in case.body and case.body["model"] != "" and \
            isinstance(case.body["model"], str) and case.meta is not None and \
            case.meta.generation.mode == GenerationMode.POSITIVE:
        case.body["model"] = MODEL  # valid requests name the served model, so some reach an engine
    if isinstance(case.body, dict) and case.body.get("ignore_eos") and not case.body.get("max_tokens") \
            and not case.body.get("max_completion_tokens"):
        case.body["max_tokens"] = 64  # else it runs to the model's context (131,072 tokens), as vLLM would
    auth = {"authorization": f"Bearer {USER_KEY}"}
    response = case.call(base_url=deployment.base, headers=auth, timeout=CALL_TIMEOUT_S)
    # the headers it went with: the checks that send it again (without auth, with other methods) know the key
    case.validate_response(response, checks=ALL_CHECKS, headers=auth)
    if response.status_code >= 400:
        error = json.loads(response.content)["error"]
        assert error["code"] == response.status_code and isinstance(error["message"], str)
