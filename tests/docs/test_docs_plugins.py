"""docs/router.md documents every routing plugin of the registry, each with an example that loads,
and its profile example is a router config that loads (this check read README.md before the
README's router section moved to docs/router.md)."""

from __future__ import annotations

import pytest
import yaml

from router.config import ProfileConfig, parse_router_config
from router.plugins.registry import PLUGINS
from tests.docs.mdblocks import ROOT

pytestmark = pytest.mark.unit


def _routing_section() -> str:
    text = (ROOT / "docs" / "router.md").read_text()
    return text[text.index("- **Routing** (`profiles:`"):text.index("- **Prompt reading**")]


def test_the_profile_example_loads() -> None:
    section = _routing_section()
    start = section.index("```yaml") + len("```yaml")
    block = section[start:section.index("```", start)]
    parse_router_config({"require_keys": False, **yaml.safe_load(block)})


def test_every_plugin_has_a_row_with_an_example_that_loads() -> None:
    rows = {line.split("|")[1].strip().strip("`"): line.split("|")[4] for line in _routing_section().splitlines()
            if line.strip().startswith("| `")}
    assert set(rows) == set(PLUGINS)
    for name, example in rows.items():
        snippet = yaml.safe_load(example.split("`")[1])
        assert name in str(snippet)
        ProfileConfig.model_validate(snippet)
