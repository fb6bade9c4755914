"""The OpenAPI document the router serves, generated from the pydantic models: every route the
router serves is in it (taken from the router's own route constants, so a new route without
documentation fails here), it validates as OpenAPI 3.1 (the OAS 3.1 meta-schema schemathesis
ships, offline; each schema a valid draft 2020-12 schema; every $ref resolves), the request
schemas agree with the engine (a body the engine serves validates, one it refuses does not), and
what the engine and the router really answer validates against the documented answers."""

from __future__ import annotations

import json
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
from referencing import Registry
from referencing.jsonschema import DRAFT202012
from schemathesis.specs.openapi.definitions import OPENAPI_31

from pools.model import PlacementRequest, PoolSpec
from pools.placement import get_policy
from pools.routing import table_from_plan
from router import routes, targets
from router.server import GENERATE_PATHS
from router.state import Replicas
from simengine import protocol, responses, serving, tokenize
from simengine.toolcall import ToolSetup
from tests.conftest import ROOT
from topology import read_source
from wire import openai as wire
from wire.errors import ApiError

pytestmark = pytest.mark.unit

CLASSES = ["interactive", "standard", "batch"]
LIMIT = 4096
DOC: dict[str, Any] = json.loads(routes.served_document(CLASSES, LIMIT))
REGISTRY: Registry[Any] = Registry().with_resource("urn:isle:openapi", DRAFT202012.create_resource(DOC))
LIMITS = protocol.Limits(model="m", max_model_len=8192)
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8}
COMPLETION = {"model": "m", "prompt": "once upon a time", "max_tokens": 8}
METHODS = {"GET": "get", "POST": "post"}


def validator(name: str) -> Any:
    return jsonschema.Draft202012Validator({"$ref": f"urn:isle:openapi#/components/schemas/{name}"},
                                           registry=REGISTRY)


def valid(name: str, instance: Any) -> bool:
    return bool(validator(name).is_valid(instance))


def served_routes() -> dict[str, set[str]]:
    """Every (path, method) the router serves, from its route constants ({model}: the template
    of `GET /v1/models/{id}`). HEAD is GET without the body: not an operation of its own."""
    out = {path: {METHODS[m] for m in methods if m in METHODS} for path, methods in routes.ROUTES.items()}
    for path in GENERATE_PATHS | routes.TOKEN_PATHS:
        out.setdefault(path, set()).add("post")
    out[routes.MODELS_PREFIX + "{model}"] = {METHODS[m] for m in routes.allowed(routes.MODELS_PREFIX + "x") or ()
                                             if m in METHODS}
    return out


def test_every_route_the_router_serves_is_documented_and_nothing_else() -> None:
    documented = {path: set(item) for path, item in DOC["paths"].items()}
    assert documented == served_routes()
    ids = [op["operationId"] for item in DOC["paths"].values() for op in item.values()]
    assert len(ids) == len(set(ids))
    for path, item in DOC["paths"].items():
        concrete = path.replace("{model}", "some-model")
        assert routes.allowed(concrete) is not None, path
        for op in item.values():
            assert "405" in op["responses"]  # a known path with another method: 405 with Allow
            assert op["security"] in ([], [{"bearer": []}])


def test_the_document_validates_as_openapi_3_1() -> None:
    assert DOC["openapi"].startswith("3.1.")
    jsonschema.Draft202012Validator(OPENAPI_31).validate(DOC)
    for schema in DOC["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)
    for item in DOC["paths"].values():
        for op in item.values():
            inline = [p["schema"] for p in op.get("parameters", [])]
            inline += [m["schema"] for m in op.get("requestBody", {}).get("content", {}).values()]
            inline += [m["schema"] for r in op["responses"].values() for m in r.get("content", {}).values()]
            for schema in inline:
                jsonschema.Draft202012Validator.check_schema(schema)


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        return ([node["$ref"]] if "$ref" in node else []) + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def _defaults(node: Any) -> list[dict[str, Any]]:
    """Every schema below `node` that gives a default."""
    if isinstance(node, dict):
        return ([node] if "default" in node else []) + [d for v in node.values() for d in _defaults(v)]
    if isinstance(node, list):
        return [d for v in node for d in _defaults(v)]
    return []


def test_every_default_is_a_value_its_schema_takes() -> None:
    found = _defaults(DOC["components"]["schemas"])
    assert found
    for schema in found:
        rest = json.loads(json.dumps({k: v for k, v in schema.items() if k != "default"})
                          .replace('"#/components/', '"urn:isle:openapi#/components/'))
        assert jsonschema.Draft202012Validator(rest, registry=REGISTRY).is_valid(schema["default"]), schema


def test_every_ref_resolves() -> None:
    refs = set(_refs(DOC))
    assert refs
    resolver = REGISTRY.resolver(base_uri="urn:isle:openapi")
    for ref in refs:
        assert ref.startswith("#/components/")
        assert resolver.lookup(ref).contents is not None, ref


def test_the_router_settings_are_in_the_document() -> None:
    header = DOC["paths"]["/v1/chat/completions"]["post"]["parameters"][0]
    assert header["name"] == "x-slo-class" and header["in"] == "header"
    assert header["schema"]["enum"] == CLASSES
    assert DOC["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    assert valid("ChatCompletionRequest", {**CHAT, "max_tokens": LIMIT})
    assert not valid("ChatCompletionRequest", {**CHAT, "max_tokens": LIMIT + 1})
    assert not valid("ChatCompletionRequest", {**CHAT, "max_completion_tokens": LIMIT + 1})
    assert not valid("CompletionRequest", {**COMPLETION, "max_tokens": LIMIT + 1})


def engine_accepts(body: dict[str, Any], kind: str) -> bool:
    try:
        protocol.check(protocol.read(body, kind), body, LIMITS, ToolSetup())
    except ApiError as err:
        assert err.status == 400, err.message
        return False
    return True


TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
CASES = [
    ("chat", CHAT),
    ("chat", {**CHAT, "n": 3, "temperature": 0.7, "seed": 7, "stop": ["\n", "END"], "top_p": 0.9}),
    ("chat", {**CHAT, "stream": True, "stream_options": {"include_usage": True}}),
    ("chat", {**CHAT, "logprobs": True, "top_logprobs": 3}),
    ("chat", {**CHAT, "tools": [TOOL], "tool_choice": "none"}),
    ("chat", {**CHAT, "response_format": {"type": "json_object"}, "unknown_field": 1}),
    ("chat", {**CHAT, "messages": [{"role": "system", "content": [{"type": "text", "text": "be brief"}]},
                                   {"role": "user", "content": "hi"}]}),
    ("chat", {**CHAT, "temperature": 3}),
    ("chat", {**CHAT, "temperature": -0.5}),
    ("chat", {**CHAT, "top_p": 0}),
    ("chat", {**CHAT, "n": 2, "temperature": 0}),
    ("chat", {**CHAT, "stream_options": {"include_usage": True}}),
    ("chat", {**CHAT, "top_logprobs": 2}),
    ("chat", {**CHAT, "top_logprobs": 21, "logprobs": True}),
    ("chat", {**CHAT, "tools": [TOOL]}),
    ("chat", {**CHAT, "tools": []}),
    ("chat", {**CHAT, "stop": ["a", "b", "c", "d", "e"]}),
    ("chat", {**CHAT, "stop": ""}),
    ("chat", {**CHAT, "ignore_eos": None}),
    ("chat", {**CHAT, "max_tokens": 0}),
    ("completion", COMPLETION),
    ("completion", {**COMPLETION, "prompt": ["one", "two"], "n": 2, "temperature": 1.0, "logprobs": 2}),
    ("completion", {**COMPLETION, "prompt": [1, 2, 3], "stop_token_ids": [5]}),
    ("completion", {**COMPLETION, "prompt": ""}),
    ("completion", {**COMPLETION, "n": None}),
    ("completion", {**COMPLETION, "temperature": 2.5}),
    ("completion", {**COMPLETION, "stop_token_ids": [-1]}),
    ("completion", {**COMPLETION, "stop_token_ids": ["x"]}),
]


@pytest.mark.parametrize(("kind", "body"), CASES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(CASES)])
def test_the_request_schema_takes_what_the_engine_takes(kind: str, body: dict[str, Any]) -> None:
    name = "ChatCompletionRequest" if kind == "chat" else "CompletionRequest"
    assert valid(name, body) == engine_accepts(body, kind), body


def test_the_wire_models_bounds_are_the_engines() -> None:
    """One definition of each limit (wire.openai) serves the engine and the document: a
    body at the engine's limits is valid, one past them is not."""
    base: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert valid("ChatCompletionRequest", {**base, "stop": ["x"] * wire.MAX_STOP_STRINGS})
    assert not valid("ChatCompletionRequest", {**base, "stop": ["x"] * (wire.MAX_STOP_STRINGS + 1)})
    assert valid("ChatCompletionRequest", {**base, "logprobs": True, "top_logprobs": wire.MAX_LOGPROBS})
    assert not valid("ChatCompletionRequest", {**base, "logprobs": True, "top_logprobs": wire.MAX_LOGPROBS + 1})
    assert not valid("ChatCompletionRequest", {**base, "seed": wire.INT64[1] + 1})


def test_an_engine_refused_temperature_is_outside_the_schema() -> None:
    body = {**CHAT, "temperature": 3}
    assert not engine_accepts(body, "chat")
    errors = list(validator("ChatCompletionRequest").iter_errors(body))
    assert [list(e.absolute_path) for e in errors] == [["temperature"]]  # that field, and only it


def answers(body: dict[str, Any], kind: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """What the simulated engine answers `body` with: the whole body and the streamed chunks."""
    req = protocol.read(body, kind)
    budgets = protocol.check(req, body, LIMITS, ToolSetup())
    choices = serving.choices_for(req, "rid-1", budgets, ToolSetup())
    chunks = responses.Chunks(req, "rid-1", 1, "m")
    events = [chunks.roles(choices)] if kind == "chat" else []
    for c in choices:
        while c.out.finish is None:
            t = c.out.next()
            if req.sampling.logprobs is not None:
                c.tokens.append(t)
            events.append(chunks.token(c, t))
    events.append(chunks.usage(choices, {}))
    data = [line.removeprefix(b"data: ") for e in events for line in e.split(b"\n\n") if line]
    return responses.full(req, "rid-1", 1, "m", choices, {}), [json.loads(d) for d in data]


@pytest.mark.parametrize("extra", [{}, {"logprobs": True, "top_logprobs": 2, "n": 2, "temperature": 0.8},
                                   {"stop": ["e"], "seed": 3}, {"tools": [TOOL], "tool_choice": "none"}])
def test_the_engine_chat_answers_match_the_documented_ones(extra: dict[str, Any]) -> None:
    whole, chunks = answers({**CHAT, **extra}, "chat")
    validator("ChatCompletionResponse").validate(whole)
    for chunk in chunks:
        validator("ChatCompletionStreamResponse").validate(chunk)


@pytest.mark.parametrize("extra", [{}, {"logprobs": 3, "prompt": ["a", "b"]}, {"prompt": [5, 6, 7], "echo": False}])
def test_the_engine_completion_answers_match_the_documented_ones(extra: dict[str, Any]) -> None:
    whole, chunks = answers({**COMPLETION, **extra}, "completion")
    validator("CompletionResponse").validate(whole)
    for chunk in chunks:
        validator("CompletionStreamResponse").validate(chunk)


def test_tokenize_models_and_errors_match_the_documented_answers() -> None:
    for body in ({"model": "m", "prompt": "hello", "return_token_strs": True},
                 {"model": "m", "messages": [{"role": "user", "content": "hi"}]}):
        assert valid("TokenizeCompletionRequest", body) or valid("TokenizeChatRequest", body)
        validator("TokenizeResponse").validate(tokenize.tokenize(body, LIMITS))
    ids = tokenize.tokenize({"model": "m", "prompt": "hello"}, LIMITS)["tokens"]
    assert valid("DetokenizeRequest", {"model": "m", "tokens": ids})
    validator("DetokenizeResponse").validate(tokenize.detokenize({"model": "m", "tokens": ids}, LIMITS))
    validator("ModelList").validate(json.loads(wire.models_body(["m", "n"])))
    for err in (ApiError(400, "bad", param="model"), ApiError(404, "no such model", "NotFoundError")):
        validator("ErrorResponse").validate(json.loads(err.body()))


def test_the_admin_views_match_the_documented_answers() -> None:
    topology = read_source(str(ROOT / "configs/clusters/local-sim.yaml"))
    plan = get_policy("island-aligned").place(PlacementRequest(
        topology=topology, pools=(PoolSpec(name="mixed", role="mixed", tp=2, replicas=2, model="llama-3.1-8b"),)))
    urls = {p.replica_id: f"http://127.0.0.1:{9000 + i}" for i, p in enumerate(plan.placements)}
    replicas = Replicas(table_from_plan(plan, urls, {"mixed": "m"}), 3, 1.0)
    assert replicas.states
    for path, name in (("/admin/replicas", "ReplicasView"), ("/admin/topology", "TopologyView"),
                       ("/admin/plan", "PlanView")):
        view = routes.admin_view(path, replicas, 0, topology, plan.to_json())
        validator(name).validate(json.loads(json.dumps(view)))
    groups = json.loads(targets.targets_body(replicas.table, "127.0.0.1:8000"))
    assert len(groups) == 1 + len(plan.placements)
    for group in groups:  # Prometheus' service discovery, as documented
        validator("TargetGroup").validate(group)
