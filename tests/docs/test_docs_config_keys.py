"""The hand-written key tables of the files `loadtest` reads (scenarios, the chaos timeline) name
every key their models accept. (The deployment, router, pools and cluster files are generated:
docs/configuration.md, tests/docs/test_configdoc.py; `loadtest` sits above that generator.)"""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from loadtest.chaos.spec import (
    ChaosSpec,
    KvRemoteNic,
    KvTransportFallback,
    LinkDegrade,
    NodeLoss,
    Overload,
    ReplicaCrash,
    WorkloadShape,
)
from loadtest.scenario import AutoscaleScenarioConfig, FaultConfig, HeldConfig, RoutingConfig, ScenarioConfig
from tests.docs.mdblocks import ROOT

pytestmark = pytest.mark.unit

PAGES: list[tuple[str, tuple[type[BaseModel], ...]]] = [
    ("loadtests.md", (ScenarioConfig, FaultConfig, HeldConfig, RoutingConfig, AutoscaleScenarioConfig)),
    ("reliability.md", (ChaosSpec, ReplicaCrash, LinkDegrade, NodeLoss, Overload, KvTransportFallback, KvRemoteNic,
                        WorkloadShape)),
]


@pytest.mark.parametrize(("page", "models"), PAGES, ids=[page for page, _ in PAGES])
def test_every_key_is_documented(page: str, models: tuple[type[BaseModel], ...]) -> None:
    text = (ROOT / "docs" / page).read_text()
    missing = [f"{model.__name__}.{key}" for model in models for key in model.model_fields
               if f"`{key}`" not in text]
    assert not missing, f"docs/{page} lacks {missing}"
