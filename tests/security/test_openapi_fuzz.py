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
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from router.server import OPENAPI_PATH
from tests.security.conftest import MODEL, USER_KEY, Deployment, call

pytestmark = pytest.mark.integration
DOC = json.loads(OPENAPI_PATH.read_text())
schema = schemathesis.openapi.from_dict(DOC)
schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE], max_examples=12)
CALL_TIMEOUT_S = 15.0


CHECKS: list[schemathesis.CheckFunction] = [not_a_server_error, status_code_conformance, content_type_conformance,
                                            response_schema_conformance]


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
    response = case.call(base_url=deployment.base, headers={"authorization": f"Bearer {USER_KEY}"},
                         timeout=CALL_TIMEOUT_S)
    case.validate_response(response, checks=CHECKS)
    if response.status_code >= 400:
        error = json.loads(response.content)["error"]
        assert error["code"] == response.status_code and isinstance(error["message"], str)
