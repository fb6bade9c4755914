"""docs/configuration.md is exactly what `python -m isleserve.configdoc` writes from the models."""

from __future__ import annotations

import pytest

from isleserve.configdoc import FILE_KINDS, render, type_text
from tests.docs.mdblocks import ROOT

pytestmark = pytest.mark.unit


def test_the_configuration_reference_is_the_models_output() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == render(), ("docs/configuration.md differs from the models: "
                              "python -m isleserve.configdoc > docs/configuration.md")


def test_every_key_of_every_file_kind_is_in_the_reference() -> None:
    page = render()
    for kind in FILE_KINDS:
        assert f"### {kind.model.__name__}" in page
        for key in kind.model.model_fields:
            assert f"| `{key}` |" in page, f"{kind.model.__name__}.{key}"


@pytest.mark.parametrize(("schema", "text"), [
    ({"type": "integer", "minimum": 1}, "int (>= 1)"),
    ({"anyOf": [{"type": "number"}, {"type": "null"}]}, "float or null"),
    ({"enum": ["sim", "vllm"]}, '`"sim"` \\| `"vllm"`'),
    ({"type": "array", "items": {"$ref": "#/$defs/PoolConfig"}}, "list of [PoolConfig](#poolconfig)"),
    ({"type": "object", "additionalProperties": {"type": "string"}}, "map of str"),
])
def test_types_are_written_plainly(schema: dict[str, object], text: str) -> None:
    assert type_text(schema) == text
