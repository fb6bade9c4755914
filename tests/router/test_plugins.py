"""Routing plugins composed by name: one registry, every config form builds the same profile,
each plugin checks its own parameters (errors name the config path), one health rule for the
profile, PD and admission, and one metric timing every plugin without changing the decision."""

from __future__ import annotations

import random
from dataclasses import replace
from itertools import count

import pytest

from pools.model import DEFAULT_SLO_CLASSES
from router.admission import Admission
from router.config import ProfileConfig, parse_router_config
from router.decision import decide
from router.metrics import RouterMetrics
from router.plugins.filters import usable
from router.plugins.model import ReplicaLoad
from router.plugins.pd import pd_decide, pd_route
from router.plugins.profile import Profile
from router.plugins.registry import FILTER, PICKER, PLUGINS, SCORER
from router.plugins.spec import PluginSpec
from router.plugins.timing import PluginTimer
from tests.router.conftest import cand, req
from topology import ParseError

pytestmark = pytest.mark.unit
INTERACTIVE, STANDARD, BATCH = DEFAULT_SLO_CLASSES


SNAPSHOT = [cand(f"r{i}", load=ReplicaLoad(running=i % 3, waiting=i % 2, kv_usage=i / 10, inflight=i % 4,
                                            latency_ms=10.0 * i), tier=("nvlink", "pcie", "rdma")[i % 3])
            for i in range(8)] + [cand("sick", healthy=False), cand("pre", role="prefill")]


def test_every_config_form_builds_the_same_profile() -> None:
    forms = [
        {"scorers": {"queue-depth-scorer": 2.0, "prefix-affinity-scorer": 1.0}},
        {"scorers": {"queue-depth-scorer": {"weight": 2.0}, "prefix-affinity-scorer": {"parameters": {}}}},
        {"scorers": [{"name": "queue-depth-scorer", "weight": 2.0}, {"name": "prefix-affinity-scorer"}],
         "filters": ["health-filter", {"name": "drain-filter"}, {"name": "role-filter", "parameters": {}},
                     "slo-class-filter", {"name": "seq-headroom-filter"}, "context-filter"],
         "picker": {"name": "max-score-picker"}},
    ]
    profiles = [ProfileConfig.model_validate(f).to_profile() for f in forms]
    direct = Profile(scorers=[PluginSpec(name="queue-depth-scorer", weight=2.0),
                              PluginSpec(name="prefix-affinity-scorer")])
    for p in [*profiles, direct]:
        assert (p.filters, p.scorers, p.picker) == (profiles[0].filters, profiles[0].scorers, profiles[0].picker)
        d = decide(req(prefix=7), SNAPSHOT, p, random.Random(3))
        assert [r.replica_id for r in d.ranked] == [r.replica_id for r in decide(
            req(prefix=7), SNAPSHOT, profiles[0], random.Random(3)).ranked]


@pytest.mark.parametrize(("entry", "path"), [
    ({"scorers": {"vibes-scorer": 1.0}}, "unknown routing plugins ['vibes-scorer']"),
    ({"scorers": [{"name": "queue-depth-scorer", "parameters": {"running_weight": -1}}]},
     "profiles.standard: Value error, scorers.queue-depth-scorer.parameters.running_weight: must be within"),
    ({"scorers": {"link-tier-scorer": {"parameters": {"tiers": {"pcie": 2}}}}},
     "scorers.link-tier-scorer.parameters.tiers.pcie: must be within"),
    ({"filters": [{"name": "role-filter", "parameters": {"role": "gpu"}}]},
     "filters[0].parameters.role: must be one of"),
    ({"filters": [{"name": "health-filter", "parameters": {"strict": True}}]},
     "filters[0].parameters: unknown parameters ['strict']"),
    ({"filters": ["kv-usage-scorer"]}, "filters[0]: kv-usage-scorer is a scorer, not a filter"),
    ({"picker": "health-filter"}, "picker: health-filter is a filter, not a picker"),
    ({"scorers": [{"name": "kv-usage-scorer"}, {"name": "kv-usage-scorer"}]},
     "scorers listed twice: ['kv-usage-scorer']"),
    ({"scorers": {"kv-usage-scorer": {"name": "queue-depth-scorer"}}}, "names another plugin"),
    ({"filters": [{"name": "health-filter", "weigth": 1}]},
     "filters[0].PluginSpec.weigth: Unexpected keyword argument"),
])
def test_bad_plugins_are_config_errors_naming_the_path(entry: dict[str, object], path: str) -> None:
    with pytest.raises(ParseError, match="invalid router config") as err:
        parse_router_config({"require_keys": False, "profiles": {"standard": entry}})
    assert path in str(err.value)


def test_all_problems_of_a_profile_are_reported_at_once() -> None:
    with pytest.raises(ParseError) as err:
        parse_router_config({"require_keys": False, "default_profile": {
            "filters": ["nope-filter"], "scorers": [{"name": "prefix-affinity-scorer", "parameters": {"no_prefix": 3}}],
            "picker": "nope-picker"}})
    text = str(err.value)
    assert "default_profile" in text and "['nope-filter', 'nope-picker']" in text and "no_prefix" in text


def test_the_registry_is_one_list_of_every_kind() -> None:
    kinds = {reg.kind for reg in PLUGINS.values()}
    assert kinds == {FILTER, SCORER, PICKER}
    assert all(name.endswith(f"-{reg.kind}") for name, reg in PLUGINS.items())


def test_parameters_change_what_a_plugin_does() -> None:
    cands = [cand("running", load=ReplicaLoad(running=6)), cand("waiting", load=ReplicaLoad(waiting=1))]

    def best(parameters: dict[str, object]) -> str:
        p = Profile(scorers=[PluginSpec(name="queue-depth-scorer", parameters=parameters)])
        winner = decide(req(), cands, p, random.Random(0)).winner
        assert winner is not None
        return winner.endpoint.replica_id

    assert best({}) == "waiting"  # six running at a quarter each weigh more than one waiting
    assert best({"running_weight": 0.1}) == "running"
    decode_only = Profile(filters=["health-filter", PluginSpec(name="role-filter", parameters={"role": "prefill"})])
    assert decide(req(), SNAPSHOT, decode_only, random.Random(0)).winner == SNAPSHOT[-1]


def test_one_health_rule_for_the_profile_pd_and_admission() -> None:
    for slo in DEFAULT_SLO_CLASSES:
        for c in (cand("ok"), cand("sick", healthy=False), cand("open", load=ReplicaLoad(breaker_open=True)),
                  cand("drain", draining=True)):
            routed = decide(req(slo), [c], Profile(), random.Random(0)).winner is not None
            as_prefill = c._replace(endpoint=replace(c.endpoint, role="prefill"))
            pd = pd_route(req(slo, tokens=1000), [as_prefill, cand("d", role="decode")], None,
                          min_prompt_tokens=0, has_mixed=False).decision is not None
            assert routed == pd == usable(c, slo.sheddable), (slo.name, c.endpoint.replica_id)
    backed_up = ReplicaLoad(waiting=100)
    assert Admission.overloaded([cand("a", load=backed_up), cand("sick", healthy=False)])
    assert not Admission.overloaded([cand("a", load=backed_up), cand("idle", draining=True)])  # still takes batch


def test_timing_every_plugin_changes_no_decision() -> None:
    metrics = RouterMetrics()
    ticks = count()
    timer = PluginTimer(metrics.plugins, lambda: next(ticks) * 1e-6, every=2)
    profile = Profile(scorers={"queue-depth-scorer": 1.0, "kv-usage-scorer": 0.5, "link-tier-scorer": 0.3},
                      picker="max-score-picker")
    for seed in range(20):
        plain = decide(req(), SNAPSHOT, profile, random.Random(seed))
        timed = decide(req(), SNAPSHOT, profile, random.Random(seed), timer=timer)
        assert timed.winner == plain.winner and timed.ranked == plain.ranked and timed.order() == plain.order()
    body = metrics.render().decode()
    for plugin, kind in [("health-filter", "filter"), ("role-filter", "filter"), ("kv-usage-scorer", "scorer"),
                         ("max-score-picker", "picker")]:
        line = f'isle_router_plugin_duration_seconds_count{{kind="{kind}",plugin="{plugin}"}} 10.0'
        assert line in body
    snapshot = [cand("p", role="prefill"), cand("d", role="decode")]
    every = PluginTimer(metrics.plugins, lambda: next(ticks) * 1e-6, every=1)
    assert pd_decide(req(tokens=1000), snapshot, None, min_prompt_tokens=0, has_mixed=False, timer=every) == \
        pd_decide(req(tokens=1000), snapshot, None, min_prompt_tokens=0, has_mixed=False)
    assert 'isle_router_plugin_duration_seconds_count{kind="profile-handler",plugin="pd-profile-handler"} 1.0' \
        in metrics.render().decode()

