"""Fair shares (issue 28): pools' slo_classes in routing, each class's share of a replica's
sequence slots (routing and admission), per-tenant and per-class quotas with an injected clock,
and the config that sets them."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import re

import pytest

from pools.model import DEFAULT_SLO_CLASSES, PlacementRequest, PoolSpec, SLOClass
from pools.placement import get_policy
from pools.routing import ReplicaEndpoint, RoutingTable, table_from_plan
from router.admission import Admission
from router.call import read_call
from router.config import PDConfig, RouterConfig, parse_router_config
from router.cost import CostLimits
from router.decision import decide
from router.pd import holding_roles
from router.plugins.filters import DEFAULT_MAX_NUM_SEQS, has_headroom, serves_class, usable_of
from router.plugins.model import Candidate, ReplicaLoad, RouteRequest
from router.plugins.profile import Profile
from router.quota import BURST_S, Quota, Quotas
from router.state import Replicas, model_context
from router.workers import read_view, view_bytes
from tests.conftest import ROOT
from topology import read_source
from topology.errors import ParseError
from wire.errors import ApiError

pytestmark = pytest.mark.unit
CLASSES = {c.name: c for c in DEFAULT_SLO_CLASSES}
INTERACTIVE, STANDARD, BATCH = CLASSES["interactive"], CLASSES["standard"], CLASSES["batch"]


def cand(rid: str, classes: tuple[str, ...] = (), running: float = 0, waiting: float = 0, seqs: int = 0,
         max_num_seqs: int = 64, role: str = "mixed", healthy: bool = True) -> Candidate:
    endpoint = ReplicaEndpoint(replica_id=rid, url=f"http://127.0.0.1:1/{rid}", model="m", pool=rid,
                               role=role, slo_classes=classes, max_num_seqs=max_num_seqs,  # type: ignore[arg-type]
                               healthy=healthy)
    return Candidate(endpoint, ReplicaLoad(running=running, waiting=waiting, seqs=seqs))


def req(slo: SLOClass, seqs: int = 1, share: float = 1.0, any_pool: bool = False) -> RouteRequest:
    return RouteRequest("m", slo, 10, seqs=seqs, any_pool=any_pool, seq_share=share)


@pytest.mark.parametrize(("classes", "slo", "any_pool", "kept"), [
    ((), INTERACTIVE, False, True),  # a pool that declares no class takes every class
    (("interactive",), INTERACTIVE, False, True),
    (("standard", "batch"), INTERACTIVE, False, False),  # the case: not for interactive
    (("standard", "batch"), BATCH, False, True),
    (("standard", "batch"), INTERACTIVE, True, True),  # no pool is declared for it: any pool
])
def test_a_pool_serves_the_classes_it_is_declared_for(classes: tuple[str, ...], slo: SLOClass, any_pool: bool,
                                                      kept: bool) -> None:
    assert serves_class(req(slo, any_pool=any_pool), cand("r", classes)) is kept


@pytest.mark.parametrize(("load", "seqs", "share", "kept"), [
    ({}, 32, 0.5, True),  # 32 of 64 slots: exactly the share
    ({}, 33, 0.5, False),
    ({"running": 20, "waiting": 10}, 2, 0.5, True),
    ({"running": 20, "waiting": 10}, 3, 0.5, False),
    ({"seqs": 31}, 2, 0.5, False),  # the router's own open sequences, ahead of the scrape
    ({"running": 64, "waiting": 50}, 1, 1.0, True),  # the top class may fill every slot (the engine queues)
    ({"running": 40}, 8, 0.75, True),
])
def test_a_lower_class_fills_only_its_share_of_the_slots(load: dict[str, float], seqs: int, share: float,
                                                         kept: bool) -> None:
    c = cand("r", running=load.get("running", 0), waiting=load.get("waiting", 0), seqs=int(load.get("seqs", 0)))
    assert has_headroom(req(BATCH, seqs, share), c) is kept


def test_an_unknown_sequence_limit_is_vllms_default() -> None:
    c = cand("r", running=100, max_num_seqs=0)
    assert DEFAULT_MAX_NUM_SEQS == 256
    assert has_headroom(req(BATCH, 28, 0.5), c) and not has_headroom(req(BATCH, 29, 0.5), c)


def test_the_default_filters_and_their_one_pass_agree() -> None:
    """`usable_of` (the fast path, PD's candidates) keeps what the filter plugins keep."""
    rng = random.Random(7)
    spelled = Profile(filters=["health-filter", "drain-filter", "role-filter", "slo-class-filter",
                               "seq-headroom-filter", "health-filter"])  # not the default list: one at a time
    for k in range(300):
        snapshot = [cand(f"r{i}", rng.choice([(), ("interactive",), ("standard", "batch")]),
                         running=rng.randrange(0, 70), seqs=rng.randrange(0, 40), healthy=rng.random() > 0.2)
                    for i in range(6)]
        r = req(rng.choice([INTERACTIVE, STANDARD, BATCH]), rng.randrange(1, 20), rng.choice([0.5, 0.75, 1.0]),
                any_pool=rng.random() < 0.3)
        fast = [c.endpoint.replica_id for c in usable_of(r, snapshot, "mixed")]
        slow = decide(r, snapshot, spelled, random.Random(k))
        assert sorted(fast) == sorted(c.endpoint.replica_id for c in slow.order()), (r, snapshot)


def test_admission_refuses_a_lower_class_when_every_replica_for_it_is_at_its_share() -> None:
    full = [cand("a", running=30), cand("b", ("interactive",), running=0), cand("p", running=0, role="prefill")]
    with pytest.raises(ApiError) as err:
        Admission.check_headroom(req(BATCH, 4, 0.5), full)
    assert (err.value.status, err.value.cause) == (429, "reserved_capacity")
    assert "50%" in err.value.message
    Admission.check_headroom(req(BATCH, 2, 0.5), full)  # fits in a's share
    Admission.check_headroom(req(INTERACTIVE, 40, 1.0), full)  # the top class is never held back here
    Admission.check_headroom(req(BATCH, 4, 0.5), [cand("b", ("interactive",))])  # none for it: routing says 503


def test_a_decode_replica_counts_for_a_pd_only_layout() -> None:
    pd_only = [cand("p", role="prefill"), cand("d", role="decode", running=31)]
    with pytest.raises(ApiError):
        Admission.check_headroom(req(BATCH, 2, 0.5), pd_only)
    Admission.check_headroom(req(BATCH, 1, 0.5), pd_only)


@pytest.mark.parametrize(("body", "mixed", "roles"), [
    ({"messages": [{"role": "user", "content": "hi"}]}, {"m"}, ("mixed",)),  # short: never split
    ({"messages": [{"role": "user", "content": "word " * 400}]}, {"m"}, ("mixed", "decode")),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 2}, {"m"}, ("mixed",)),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 2}, set(), ("decode",)),
    ({"messages": [{"role": "user", "content": "hi"}]}, set(), ("decode",)),  # PD only
])
def test_the_roles_that_would_hold_a_requests_sequences(body: dict[str, object], mixed: set[str],
                                                        roles: tuple[str, ...]) -> None:
    call = read_call(json.dumps({"model": "m", **body}).encode(), "/v1/chat/completions", BATCH,
                     max_body_bytes=1 << 20, max_tokens_limit=4096, mixed=frozenset(mixed))
    assert holding_roles(PDConfig(min_prompt_tokens=256), call, frozenset(mixed)) == roles


def test_a_short_prompt_is_refused_when_the_mixed_replicas_are_full_whatever_the_decodes_hold() -> None:
    snapshot = [cand("m1", running=32), cand("d1", role="decode")]
    with pytest.raises(ApiError):
        Admission.check_headroom(req(BATCH, 1, 0.5), snapshot, ("mixed",))
    Admission.check_headroom(req(BATCH, 1, 0.5), snapshot, ("mixed", "decode"))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_tenant_over_its_concurrency_gets_429_until_one_ends() -> None:
    q = Quotas({"t": Quota(max_concurrency=2)}, Quota(), {}, Clock())
    q.enter("t", "batch", 10)
    q.enter("t", "batch", 10)
    with pytest.raises(ApiError) as err:
        q.enter("t", "batch", 10)
    assert (err.value.status, err.value.cause, err.value.headers) == (429, "key_concurrency", (("retry-after", "1"),))
    q.enter("other", "batch", 10)  # another tenant: the default quota (none)
    q.leave("t")
    q.enter("t", "batch", 10)


def test_a_token_rate_refuses_with_the_wait_until_the_bucket_holds_the_tokens() -> None:
    clock = Clock()
    q = Quotas({"t": Quota(tokens_per_s=100, burst_tokens=1000)}, Quota(), {}, clock)
    q.enter("t", "batch", 900)
    with pytest.raises(ApiError) as err:
        q.enter("t", "batch", 500)  # 100 left: 400 more take 4 s
    assert (err.value.cause, err.value.headers) == ("key_token_rate", (("retry-after", "4"),))
    clock.now += 4.0
    q.enter("t", "batch", 500)


def test_a_request_bigger_than_the_burst_passes_on_a_full_bucket_and_leaves_a_debt() -> None:
    clock = Clock()
    q = Quotas({}, Quota(tokens_per_s=10), {}, clock)  # burst: 10 s of the rate
    q.enter("t", "batch", 1000)  # > the 100-token burst: passes once, full bucket
    with pytest.raises(ApiError) as err:
        q.enter("t", "batch", 1)
    assert err.value.headers == (("retry-after", "91"),)  # 900 tokens of debt + 1, at 10 tokens/s
    assert BURST_S == 10.0


def test_a_class_rate_is_shared_by_its_tenants_and_refunds_the_tenants_bucket() -> None:
    clock = Clock()
    q = Quotas({"a": Quota(tokens_per_s=1000)}, Quota(), {"batch": Quota(tokens_per_s=10, burst_tokens=100)}, clock)
    q.enter("a", "batch", 80)
    with pytest.raises(ApiError) as err:
        q.enter("b", "batch", 80)  # b has no rate of its own; the class's bucket is shared
    assert err.value.cause == "class_token_rate"
    with pytest.raises(ApiError):
        q.enter("a", "batch", 80)  # refused by the class: a's own bucket gets its 80 back
    q.enter("a", "interactive", 9920)  # a's 10,000-token bucket less the one batch request


def test_workers_each_hold_their_share_of_a_quota() -> None:
    assert Quota(max_concurrency=5, tokens_per_s=100, burst_tokens=40).shared(2) == Quota(
        max_concurrency=3, tokens_per_s=50, burst_tokens=20)


def config(**fair: object) -> RouterConfig:
    return parse_router_config({"require_keys": False, "fair": fair,
                                "keys": [{"tenant": "k", "key_sha256": "0" * 64, "max_concurrency": 3,
                                          "tokens_per_s": 50}]})


def test_the_default_shares_follow_the_classes_rank() -> None:
    assert config().fair.shares(CLASSES) == {"interactive": 1.0, "standard": 1.0, "batch": 0.5}
    assert config(seq_share={"standard": 0.75}).fair.shares(CLASSES)["standard"] == 0.75
    assert config(seq_share={"batch": 0.25}).fair.shares(CLASSES)["batch"] == 0.25


def test_key_entries_set_their_tenants_quota_and_others_get_the_defaults() -> None:
    tenants, anyone = config(key_max_concurrency=7).quotas()
    assert tenants == {"k": Quota(max_concurrency=3, tokens_per_s=50)}
    assert anyone == Quota(max_concurrency=7)


@pytest.mark.parametrize(("fair", "message"), [
    ({"seq_share": {"batch": 0}}, "fair.seq_share.batch: 0.0 is not in (0, 1]"),
    ({"seq_share": {"bulk": 0.5}}, "unknown SLO classes ['bulk']"),
    ({"class_rates": {"bulk": {"tokens_per_s": 5}}}, "unknown SLO classes ['bulk']"),
    ({"max_sequences": 0}, "max_sequences"),
    ({"max_sequence": 4}, "max_sequence"),  # a typo is an error
])
def test_bad_fair_settings_fail_the_config(fair: dict[str, object], message: str) -> None:
    with pytest.raises(ParseError, match=re.escape(message)):
        config(**fair)


def test_a_replica_declared_for_an_unknown_class_fails_the_config() -> None:
    with pytest.raises(ParseError, match="replica r: unknown SLO classes"):
        parse_router_config({"require_keys": False, "replicas": [
            {"replica_id": "r", "url": "http://127.0.0.1:9", "model": "m", "slo_classes": ["gold"]}]})


def test_the_router_counts_its_open_sequences_per_replica_and_knows_the_declared_pools() -> None:
    table = RoutingTable(version=1, replicas=(
        cand("a", ("interactive",)).endpoint, cand("b").endpoint))
    r = Replicas(table, 3, 5.0)
    assert r.declared == {("m", "interactive"), ("m", "*")}
    r.opened("a", 16)
    r.opened("a", 4)
    assert [c.load.seqs for c in r.snapshot()] == [20, 0]
    r.closed("a", 16)
    assert r.snapshot()[0].load.seqs == 4


def test_short_prompts_of_a_class_without_a_mixed_pool_split_over_pd() -> None:
    """configs/local.yaml's layout: prefill and decode for interactive and standard, mixed for
    standard and batch. Interactive has no mixed replica (its short prompts go PD); a class no
    pool is declared for may use the mixed one."""
    table = RoutingTable(version=1, replicas=(
        cand("p", ("interactive", "standard"), role="prefill").endpoint,
        cand("d", ("interactive", "standard"), role="decode").endpoint,
        cand("x", ("standard", "batch")).endpoint))
    r = Replicas(table, 3, 5.0)
    assert (r.mixed_for("interactive"), r.mixed_for("standard"), r.mixed_for("batch"), r.mixed_for("gold")) == (
        frozenset(), frozenset({"m"}), frozenset({"m"}), frozenset({"m"}))
    r.follow(RoutingTable(version=2, replicas=(*table.replicas[:2], cand("x", ("interactive",)).endpoint)))
    assert r.mixed_for("interactive") == {"m"}
    assert r.mixed_for("batch") == {"m"}  # no pool declared for batch now: any pool may serve it


def test_a_table_without_sequence_limits_gets_the_configured_one() -> None:
    table = RoutingTable(version=1, replicas=(cand("a", max_num_seqs=0).endpoint, cand("b", max_num_seqs=32).endpoint))
    r = Replicas(table, 3, 5.0, max_num_seqs=128)
    assert [c.endpoint.max_num_seqs for c in r.snapshot()] == [128, 32]
    r.follow(RoutingTable(version=2, replicas=table.replicas))
    assert [c.endpoint.max_num_seqs for c in r.snapshot()] == [128, 32]


def test_the_workers_view_keeps_pools_classes_and_sequence_limits() -> None:
    table = RoutingTable(version=3, replicas=(cand("a", ("standard", "batch"), max_num_seqs=128).endpoint,))
    back, _, _ = read_view(view_bytes(table, None, None))
    assert back == table


def test_every_shape_of_request_maps_to_one_decision_path() -> None:
    """The fast path (default filters) and the spelled-out profile decide the same winner."""
    snapshot = [cand(f"r{i}", c, running=r) for i, (c, r) in
                enumerate(itertools.product([(), ("interactive",), ("batch",)], [0, 20, 40]))]
    fast, spelled = Profile(), Profile(filters=["slo-class-filter", "health-filter", "drain-filter", "role-filter",
                                                "seq-headroom-filter"])
    for slo, share in ((INTERACTIVE, 1.0), (BATCH, 0.5)):
        r = req(slo, 8, share)
        a, b = decide(r, snapshot, fast, random.Random(1)), decide(r, snapshot, spelled, random.Random(1))
        assert a.winner == b.winner and a.winner is not None
        assert serves_class(r, a.winner) and has_headroom(r, a.winner)


def test_a_controllers_table_carries_each_pools_classes() -> None:
    topology = read_source(str(ROOT / "configs/clusters/local-sim.yaml"))
    pools = (PoolSpec(name="fast", role="mixed", tp=1, replicas=1, model="llama-3.1-8b", slo_classes=("interactive",)),
             PoolSpec(name="any", role="mixed", tp=1, replicas=1, model="llama-3.1-8b"))
    plan = get_policy("island-aligned").place(PlacementRequest(topology=topology, pools=pools))
    table = table_from_plan(plan, {p.replica_id: "http://127.0.0.1:9" for p in plan.placements}, {})
    assert {(r.pool, r.slo_classes) for r in table.replicas} == {("fast", ("interactive",)), ("any", ())}


@pytest.mark.parametrize(("text", "context"), [
    ('{"object": "list", "data": [{"id": "m", "max_model_len": 2048}]}', 2048),
    ('{"data": [{"id": "other", "max_model_len": 99}, {"id": "m", "max_model_len": 4096}]}', 4096),
    ('{"data": [{"id": "m"}]}', 0),
    ('{"data": [{"id": "m", "max_model_len": true}]}', 0),
    ('[1, 2]', 0),
])
def test_an_engines_context_from_its_model_card(text: str, context: int) -> None:
    assert model_context(text, "m") == context


class FakePool:
    def __init__(self, contexts: dict[str, int]) -> None:
        self.contexts = contexts

    async def text(self, base: str, path: str) -> str:
        if path == "/v1/models":
            return json.dumps({"data": [{"id": "m", "max_model_len": self.contexts[base]}]})
        return "vllm:num_requests_running 0\n"


def test_the_router_learns_each_models_smallest_context_from_its_engines() -> None:
    a, b = cand("a").endpoint, cand("b").endpoint
    r = Replicas(RoutingTable(version=1, replicas=(a, b)), 3, 5.0)
    assert r.context("m") is None
    pool = FakePool({a.url: 4096, b.url: 2048})
    for st in r.states.values():
        asyncio.run(r._scrape(pool, st))  # type: ignore[arg-type]
    assert r.context("m") == 2048
    silent = Replicas(RoutingTable(version=1, replicas=(a,)), 3, 5.0)
    asyncio.run(silent._scrape(FakePool({a.url: 0}), silent.states["a"]))  # type: ignore[arg-type]
    assert silent.states["a"].max_model_len == -1 and silent.context("m") is None  # not asked again
    call = read_call(json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode(),
                     "/v1/chat/completions", BATCH, max_body_bytes=1 << 20, max_tokens_limit=32768, mixed=frozenset(),
                     limits=CostLimits(), contexts=r.contexts)
    assert json.loads(call.payload)["max_tokens"] == 2048
