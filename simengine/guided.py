"""What guided decoding makes the simulated model write: a JSON value that satisfies a JSON
schema (`response_format` json_schema, a tool's `parameters`), or any JSON object (json_object),
drawn from a seeded generator, so the same seed gives the same value.

vLLM constrains sampling with a grammar (xgrammar) so the text is valid JSON for the schema;
here the value is drawn whole and then written (`json.dumps`, ASCII), which a grammar would
equally accept. Supported: `type` (object, array, string, number, integer, boolean, null, or a
list of them: the first), `properties` / `required` (optional properties drawn in or left out),
`additionalProperties`, `items`, `minItems` / `maxItems`, `enum`, `const`, `minimum` /
`maximum` (and the exclusive ones, for integers), `minLength` / `maxLength`, `anyOf` / `oneOf`
(the first branch), `allOf` (merged), `$ref` to `#/$defs/...` or `#/definitions/...`.
Unknown keywords (`pattern`, `format`) are ignored.
"""

from __future__ import annotations

import json
import random
from typing import Any

from wire.text import VOCAB

MAX_DEPTH = 8


def _words(rng: random.Random, lo: int = 1, hi: int = 3) -> str:
    return " ".join(rng.choice(VOCAB) for _ in range(rng.randint(lo, hi)))


def _ref(root: dict[str, Any], ref: str) -> dict[str, Any]:
    node: Any = root
    for part in ref.removeprefix("#/").split("/"):
        node = node.get(part) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else {}


def _string(schema: dict[str, Any], rng: random.Random) -> str:
    text = _words(rng)
    lo, hi = int(schema.get("minLength", 0)), schema.get("maxLength")
    while len(text) < lo:
        text += " " + rng.choice(VOCAB)
    return text[:int(hi)] if hi is not None else text


def _number(schema: dict[str, Any], rng: random.Random, integer: bool) -> int | float:
    lo = schema.get("minimum", schema.get("exclusiveMinimum", 0))
    hi = schema.get("maximum", schema.get("exclusiveMaximum", max(float(lo), 0.0) + 100))
    if integer:
        low = int(lo) + (1 if "exclusiveMinimum" in schema and "minimum" not in schema else 0)
        high = int(hi) - (1 if "exclusiveMaximum" in schema and "maximum" not in schema else 0)
        return rng.randint(low, max(low, high))
    return round(rng.uniform(float(lo), float(hi)), 2)


def _object(schema: dict[str, Any], rng: random.Random, root: dict[str, Any], depth: int) -> dict[str, Any]:
    props = schema.get("properties")
    required = set(schema.get("required") or ())
    out: dict[str, Any] = {}
    if isinstance(props, dict) and props:
        for name, sub in props.items():
            if name in required or rng.random() < 0.5:
                out[name] = value(sub if isinstance(sub, dict) else {}, rng, root, depth + 1)
        return out
    if required:
        return {name: _words(rng, 1, 1) for name in sorted(required)}
    extra = schema.get("additionalProperties")
    if extra is False:
        return {}
    sub = extra if isinstance(extra, dict) else {"type": "string"}
    return {rng.choice(VOCAB): value(sub, rng, root, depth + 1) for _ in range(rng.randint(1, 3))}


def value(schema: dict[str, Any], rng: random.Random, root: dict[str, Any] | None = None, depth: int = 0) -> Any:
    """A value that satisfies `schema` (see the module docstring for the keywords honoured)."""
    root = schema if root is None else root
    if "$ref" in schema and isinstance(schema["$ref"], str):
        return value(_ref(root, schema["$ref"]), rng, root, depth + 1) if depth < MAX_DEPTH else None
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            first = schema[key][0]
            return value(first if isinstance(first, dict) else {}, rng, root, depth + 1)
    if isinstance(schema.get("allOf"), list):
        merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
        for part in schema["allOf"]:
            if isinstance(part, dict):
                merged = {**merged, **part, "properties": {**merged.get("properties", {}),
                                                            **part.get("properties", {})},
                          "required": [*merged.get("required", []), *part.get("required", [])]}
        return value(merged, rng, root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = kind[0] if kind else None
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    if depth >= MAX_DEPTH and kind in ("object", "array"):
        return {} if kind == "object" else []
    if kind == "object":
        return _object(schema, rng, root, depth)
    if kind == "array":
        lo = int(schema.get("minItems", 1))
        hi = int(schema.get("maxItems", max(lo, 3)))
        items = schema["items"] if isinstance(schema.get("items"), dict) else {"type": "string"}
        return [value(items, rng, root, depth + 1) for _ in range(rng.randint(lo, max(lo, hi)))]
    if kind == "string":
        return _string(schema, rng)
    if kind in ("integer", "number"):
        return _number(schema, rng, kind == "integer")
    if kind == "boolean":
        return rng.random() < 0.5
    return None


def json_text(schema: dict[str, Any] | None, seed: int) -> str:
    """The JSON the model writes for `schema` (None: any JSON object, as json_object asks)."""
    rng = random.Random(seed ^ 0x6A736F6E)
    return json.dumps(value(schema if schema is not None else {"type": "object"}, rng))
