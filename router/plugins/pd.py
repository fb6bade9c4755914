"""The PD profile: whether a request is split over a prefill and a decode replica, and which pair.

Candidates: the model's usable replicas (the one health rule, `filters.usable`) in the prefill,
decode and mixed roles. A pair is priced as predicted TTFT (`router.plugins.ttft`):

    prefill queue    prompts ahead on the prefill replica x its predicted prefill of this prompt
    prefill          the prompt over the prefill replica's own TP links
    KV handover      the KV over the paths between the two replicas' GPUs, rank by rank
    decode admission (1 + requests waiting on the decode) x one decode step of its batch

PD or mixed: a prompt under `min_prompt_tokens` never goes PD when the model has mixed replicas;
above it the pair wins unless an *idle* usable mixed replica (nothing running, waiting or in
flight) would finish the prompt sooner than the pair's prefill replica would (its queue x its
prefill + its prefill). The handover (KV transfer and the decode's first step) is not held
against the pair: it is the price of keeping a long prefill off the decodes' steps (DistServe's
prefill-decode interference), which `min_prompt_tokens` says is worth paying; queueing buys
nothing, so it counts. Only an idle mixed replica: on a busy one the prompt would stall the
decodes running there and the prompts queued behind it, which this prediction does not price
(in the simulator, letting any mixed replica win cost the chaos deployment 23 % of its capacity).
So an idle mixed replica takes a prompt from a backed-up pair; on idle replicas a long prompt
still splits. A deployment without mixed replicas splits every prompt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from physics import catalog, costmodel, kvtransfer
from router.plugins.filters import usable_of
from router.plugins.model import Candidate, ReplicaLoad, RouteRequest
from router.plugins.timing import PluginTimer
from router.plugins.ttft import FALLBACK_MODEL, ahead, decode_step_ms, hardware, prefill_ms
from topology import GpuRef, Topology, path, tier

PD_PLUGIN = "pd-profile-handler"
TIE = 1e-9
"""Predictions this close (relative) are equal: a tie goes to PD (floating-point noise aside, an
idle mixed replica and an idle pair on the same hardware predict the same prefill)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PDDecision:
    prefill: Candidate
    decode: Candidate
    predicted_ttft_ms: float
    kv_ms: float
    tier: str
    """Tier of the KV path (prefill GPUs + decode GPUs)."""
    ranked: tuple[tuple[str, str, float], ...]
    decode_order: tuple[Candidate, ...] = ()
    """Decodes to try for this prefill, best first (any decode can claim the prefill's KV)."""
    tiers: Mapping[str, str] = field(default_factory=dict)
    """KV-path tier per decode replica id."""
    handover_ms: float = 0.0
    """KV transfer plus the decode's first step: what PD adds to the prefill itself."""
    ready_ms: float = 0.0
    """The predicted TTFT less the handover: prefill queue + prefill + the decode's waiting."""
    mixed_ttft_ms: float | None = None
    """The best usable mixed replica's predicted TTFT, when the choice weighed one."""
    kv_bytes: float = 0.0
    """The prompt's KV (`kvtransfer.kv_bytes`): what the handover moves."""
    rates: Mapping[str, tuple[float, float, float]] = field(default_factory=dict)
    """Per decode replica id (of the chosen prefill): the KV path's expected ms per byte, its
    set-up latency in ms, and the decode's predicted first step in ms (`router.kvwatch`
    measures against them)."""


PairCosts = Mapping[tuple[str, str], tuple[float, float, bool]]
"""Per (prefill, decode) replica ids, as measured (`router.kvwatch.KvWatch.costs`): the KV
transfer's measured ms per byte (0: not measured), a weight on it, and whether the pair is open
(an avoided pair is chosen only when no open pair is usable)."""


class PDRoute(NamedTuple):
    """PD's answer with its reason: `decision` None sends the request whole to a mixed replica."""

    decision: PDDecision | None
    reason: str


def pd_route(req: RouteRequest, snapshot: Sequence[Candidate], topology: Topology | None, *,
             min_prompt_tokens: int, has_mixed: bool, measured: PairCosts | None = None) -> PDRoute:
    """`has_mixed`: the routing table has mixed replicas of the model, healthy or not.
    `measured`: pairs' measured KV transfers, where the router has them (the cost model elsewhere)."""
    if req.prompt_tokens < min_prompt_tokens and has_mixed:
        return PDRoute(None, f"{req.prompt_tokens} prompt tokens < min_prompt_tokens {min_prompt_tokens}")
    prefills, decodes = usable_of(req, snapshot, "prefill"), usable_of(req, snapshot, "decode")
    pair = pd_pair(req, prefills, decodes, topology, measured) if prefills and decodes else None
    if pair is None:
        return PDRoute(None, f"no usable prefill/decode pair ({len(prefills)} prefill, {len(decodes)} decode)")
    mixed = usable_of(req, snapshot, "mixed") if has_mixed else []
    if not mixed:
        return PDRoute(pair, f"pd {pair.predicted_ttft_ms:.1f} ms, no usable mixed replica")
    idle = [c for c in mixed if idle_replica(c.load)]
    if not idle:
        return PDRoute(pair, f"pd {pair.predicted_ttft_ms:.1f} ms, no idle mixed replica")
    best = min(prefill_ms(hardware(c.endpoint, topology), uncached(req, c)) for c in idle)  # nothing ahead of it
    if best < pair.ready_ms * (1.0 - TIE):
        return PDRoute(None, f"idle mixed {best:.1f} ms < pd {pair.ready_ms:.1f} ms before the handover")
    return PDRoute(_with_mixed(pair, best), f"pd {pair.ready_ms:.1f} ms before the handover <= idle mixed "
                                            f"{best:.1f} ms")


def uncached(req: RouteRequest, c: Candidate) -> int:
    """The prompt tokens a prefill on `c` computes: those its prefix cache does not hold
    (`router.kvindex`; vLLM always computes the last one)."""
    return max(1, req.prompt_tokens - req.cached.get(c.endpoint.replica_id, 0))


def idle_replica(load: ReplicaLoad) -> bool:
    """Nothing running, waiting or in flight from this router: a prompt sent there delays no
    other request (no decode shares its steps, no prompt queues behind it)."""
    return load.running < 1 and load.waiting < 1 and load.inflight == 0


def pd_decide(req: RouteRequest, snapshot: Sequence[Candidate], topology: Topology | None, *, min_prompt_tokens: int,
              has_mixed: bool, timer: PluginTimer | None = None, measured: PairCosts | None = None
              ) -> PDDecision | None:
    """The pair for this request, or None: a mixed replica serves it whole (`pd_route` says why).
    The router and the offline simulator both call this."""
    if timer is None or not timer.due():
        return pd_route(req, snapshot, topology, min_prompt_tokens=min_prompt_tokens, has_mixed=has_mixed,
                        measured=measured).decision
    t0 = timer.clock()
    out = pd_route(req, snapshot, topology, min_prompt_tokens=min_prompt_tokens, has_mixed=has_mixed,
                        measured=measured).decision
    timer.record("profile-handler", PD_PLUGIN, timer.clock() - t0)
    return out


def _with_mixed(pair: PDDecision, mixed_ms: float) -> PDDecision:
    return replace(pair, mixed_ttft_ms=mixed_ms)


def pd_pair(req: RouteRequest, prefills: Sequence[Candidate], decodes: Sequence[Candidate],
            topology: Topology | None, measured: PairCosts | None = None) -> PDDecision | None:
    """The prefill/decode pair with the lowest predicted TTFT (module docstring); with `measured`,
    a pair's KV transfer as measured and weighted, and an avoided pair only when no open one is."""
    tokens = req.prompt_tokens
    steps = {d.endpoint.replica_id: decode_step_ms(hardware(d.endpoint, topology), d.load.running + 1,
                                                   d.load.kv_usage, tokens) for d in decodes}
    top: tuple[bool, _Pair] | None = None  # (avoided, pair): an avoided pair ranks after every open one
    ranked: list[tuple[str, str, float]] = []
    tiers: dict[tuple[str, str], str] = {}
    shut: set[tuple[str, str]] = set()
    rates: dict[tuple[str, str], tuple[float, float, float]] = {}
    for p in prefills:
        hw = hardware(p.endpoint, topology)
        queue = ahead(p.load) / hw.load_ranks * prefill_ms(hw, tokens)  # each one ahead: a prompt like this
        pre = prefill_ms(hw, uncached(req, p))
        for d in decodes:
            if d.endpoint.model != p.endpoint.model:
                continue
            key = (p.endpoint.replica_id, d.endpoint.replica_id)
            rate, factor, open_now = measured.get(key, (0.0, 1.0, True)) if measured else (0.0, 1.0, True)
            kv, tier_name, expected, latency = kv_priced(p, d, tokens, topology, rate)
            kv *= factor
            tiers[key] = tier_name
            step = steps[d.endpoint.replica_id]
            rates[key] = (expected, latency, step)
            if not open_now:
                shut.add(key)
            pair = _Pair(ready_ms=queue + pre + d.load.waiting * step, handover_ms=kv + step, kv_ms=kv,
                         tier=tier_name, prefill=p, decode=d)
            ranked.append((*key, pair.ttft_ms()))
            if top is None or (not open_now, pair.ttft_ms()) < (top[0], top[1].ttft_ms()):
                top = (not open_now, pair)
    if top is None:
        return None
    best = top[1]
    ranked.sort(key=lambda r: (r[:2] in shut, r[2]))
    chosen = best.prefill.endpoint.replica_id
    by_id = {c.endpoint.replica_id: c for c in decodes}
    order = tuple(by_id[dec] for pre_id, dec, _ in ranked if pre_id == chosen)
    return PDDecision(prefill=best.prefill, decode=best.decode, predicted_ttft_ms=best.ttft_ms(), kv_ms=best.kv_ms,
                      tier=best.tier, ranked=tuple(ranked[:8]), decode_order=order, handover_ms=best.handover_ms,
                      ready_ms=best.ready_ms, tiers={dec: t for (pre_id, dec), t in tiers.items() if pre_id == chosen},
                      kv_bytes=kvtransfer.kv_bytes(_model(best.prefill), tokens),
                      rates={dec: r for (pre_id, dec), r in rates.items() if pre_id == chosen})


class _Pair(NamedTuple):
    ready_ms: float
    """Until the decode would take the request: prefill queue, prefill, the decode's waiting."""
    handover_ms: float
    """KV transfer plus the decode's first step."""
    kv_ms: float
    tier: str
    prefill: Candidate
    decode: Candidate

    def ttft_ms(self) -> float:
        return self.ready_ms + self.handover_ms


def kv_priced(p: Candidate, d: Candidate, tokens: int, topology: Topology | None, measured_ms_per_byte: float = 0.0
              ) -> tuple[float, str, float, float]:
    """The KV handover's time, its path's tier, the path's expected ms per byte and set-up
    latency (the path's, and the connector's per-layer transfer requests:
    `kvtransfer.kv_requests_ms`); `measured_ms_per_byte` (when > 0) in place of the expected rate
    where the router measured the pair (`router.kvwatch`). Without a topology that knows both
    replicas' GPUs: the named fallback paths (`kvtransfer.KV_*_FALLBACK`), tier `local` on one
    named node and `rdma` otherwise."""
    pe, de = p.endpoint, d.endpoint
    model = _model(p)
    expected, latency_ms, tier_name = kv_route(model, topology, pe.node, pe.gpus, de.node, de.gpus)
    ms_per_byte = measured_ms_per_byte if measured_ms_per_byte > 0 and expected else expected
    kv = kvtransfer.kv_bytes(model, tokens) * ms_per_byte + latency_ms if ms_per_byte else 0.0
    return kv, tier_name, expected, latency_ms


def _model(c: Candidate) -> catalog.ModelSpec:
    return catalog.models().get(c.endpoint.catalog_model or "") or catalog.model(FALLBACK_MODEL)


KvRoute = tuple[float, float, str]
"""(ms per byte of the KV, latency ms, tier): `kvtransfer.kv_handover_rate` of a replica pair's paths."""
_ROUTES: dict[tuple[int, str, tuple[int, ...], str, tuple[int, ...]], tuple[Topology | None, KvRoute, int]] = {}
_SAME_NODE = kvtransfer.kv_handover_rate([kvtransfer.KV_SAME_NODE_FALLBACK])
_CROSS_NODE = kvtransfer.kv_handover_rate([kvtransfer.KV_CROSS_NODE_FALLBACK])


def kv_route(model: catalog.ModelSpec, topology: Topology | None, pnode: str, pgpus: tuple[int, ...], dnode: str,
             dgpus: tuple[int, ...]) -> KvRoute:
    """The KV paths between two replicas, prefill rank i to decode rank i (as the engines move
    it; the simulator's `loadtest.sim.network.legs` too), priced, with the tier of all their GPUs;
    the latency includes the `model`'s per-layer transfer requests, queued on the pair's busiest
    NIC (`kvtransfer.kv_requests_ms`). The paths are a function of the (immutable) topology and the
    two GPU groups, so remembered: a PD decision weighs every prefill/decode pair."""
    _, (ms_per_byte, latency_ms, tier_name), queue = _route(topology, pnode, pgpus, dnode, dgpus)
    return ms_per_byte, latency_ms + kvtransfer.kv_layer_requests_ms(model, queue), tier_name


def _route(topology: Topology | None, pnode: str, pgpus: tuple[int, ...], dnode: str, dgpus: tuple[int, ...]
           ) -> tuple[Topology | None, KvRoute, int]:
    key = (id(topology), pnode, pgpus, dnode, dgpus)
    found = _ROUTES.get(key)
    if found is not None and found[0] is topology:
        return found
    refs = [GpuRef(pnode, g) for g in pgpus] + [GpuRef(dnode, g) for g in dgpus]
    if topology is not None and pgpus and dgpus and costmodel.located(topology, refs):
        paths = [path(topology, GpuRef(pnode, a), GpuRef(dnode, b)) for a, b in zip(pgpus, dgpus, strict=False)]
        out, queue = (*kvtransfer.kv_handover_rate(paths), tier(topology, refs)), kvtransfer.kv_request_queue(paths)
    elif pnode and pnode == dnode:
        out, queue = (*_SAME_NODE, "local"), 0
    else:
        out, queue = (*_CROSS_NODE, "rdma"), kvtransfer.kv_request_queue([kvtransfer.KV_CROSS_NODE_FALLBACK])
    if len(_ROUTES) > 65536:
        _ROUTES.clear()
    _ROUTES[key] = (topology, out, queue)
    return _ROUTES[key]
