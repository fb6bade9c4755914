"""What a live run measured, next to what the simulator predicts for it: client timings in
modelled seconds, the engines' own virtual timings (their /metrics histograms, independent of this
machine's speed), and the simulator run on exactly the requests that were sent."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from isleserve.planning import plan_for, resolve_topology
from isleserve.settings import AppArgs
from loadtest.live.deploy import ROOT
from loadtest.model import RequestResult, TraceRequest
from loadtest.sim.cluster import simulate
from loadtest.sim.model import SimConfig
from router.plugins.profile import Profile, check_profile
from wire import client
from wire.promtext import parse


def modelled(results: Sequence[RequestResult], time_scale: float) -> list[RequestResult]:
    """Client timings in modelled seconds (wall / time_scale)."""
    if time_scale == 1.0:
        return list(results)
    k = 1.0 / time_scale

    def scale(v: float | None) -> float | None:
        return None if v is None else v * k

    return [dataclasses.replace(r, sent_s=r.sent_s * k, ttft_s=scale(r.ttft_s), tpot_s=scale(r.tpot_s),
                                e2e_s=scale(r.e2e_s), itls_s=tuple(x * k for x in r.itls_s)) for r in results]


# the engines' own (virtual) timings
HISTOGRAMS = ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds")
PREFIX_COUNTERS = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits")


def engine_counters(engine_urls: Mapping[str, str]) -> dict[str, dict[str, float]]:
    """Per engine: the sums and counts of its TTFT and TPOT histograms (virtual seconds), and its
    prefix-cache queries and hits (tokens) when it counts them."""
    out = {}
    for rid, url in engine_urls.items():
        scrape = parse(client.get_text(f"{url}/metrics", timeout_s=5), HISTOGRAMS + PREFIX_COUNTERS)
        counters: dict[str, float] = {}
        for name in HISTOGRAMS:
            h = scrape.histogram(name)
            if h is not None:
                counters[f"{name.removeprefix('vllm:')}_sum"] = h.sum
                counters[f"{name.removeprefix('vllm:')}_count"] = h.count
        for name in PREFIX_COUNTERS:
            value = scrape.value(f"{name}_total")
            if value is not None:
                counters[name.removeprefix("vllm:")] = value
        out[rid] = counters
    return out


def prefix_counts(before: Mapping[str, Mapping[str, float]], after: Mapping[str, Mapping[str, float]]
                  ) -> dict[str, float]:
    """The engines' prefix-cache queries and hits between two scrapes (tokens, vLLM's counters)
    and their ratio."""
    def total(key: str) -> float:
        return sum(after[rid].get(key, 0.0) - before.get(rid, {}).get(key, 0.0) for rid in after)

    queries, hits = total("prefix_cache_queries"), total("prefix_cache_hits")
    return {"queries": queries, "hits": hits, "hit_ratio": round(hits / queries, 4) if queries else 0.0}


def engine_timings(before: Mapping[str, Mapping[str, float]], after: Mapping[str, Mapping[str, float]],
                   roles: Mapping[str, str]) -> dict[str, float]:
    """Mean TTFT and TPOT the engines recorded between two scrapes, in virtual ms.

    A client's TTFT is its replica's (a mixed one) or, for a prefill/decode pair, the prefill's
    plus the decode's (KV arrival to first token): so every engine's TTFT sum counts, over the
    first tokens of mixed and decode engines. TPOT is per token gap (decode and mixed engines).
    """
    def delta(rid: str, key: str) -> float:
        return after[rid].get(key, 0.0) - before.get(rid, {}).get(key, 0.0)

    ttft_sum = sum(delta(rid, "time_to_first_token_seconds_sum") for rid in after)
    firsts = sum(delta(rid, "time_to_first_token_seconds_count") for rid in after if roles.get(rid) != "prefill")
    tpot_sum = sum(delta(rid, "inter_token_latency_seconds_sum") for rid in after)
    gaps = sum(delta(rid, "inter_token_latency_seconds_count") for rid in after)
    return {"ttft_ms": ttft_sum * 1000 / firsts if firsts else math.nan, "requests": firsts,
            "tpot_ms": tpot_sum * 1000 / gaps if gaps else math.nan, "token_gaps": gaps}


# the simulator on what was sent
def mean_timings(results: Sequence[RequestResult]) -> dict[str, float]:
    """Mean TTFT over completed requests; TPOT per token gap (ms)."""
    ok = [r for r in results if r.ok and r.ttft_s is not None and r.e2e_s is not None]
    gaps = sum(r.output_tokens - 1 for r in ok if r.output_tokens > 1)
    decode_s = sum(r.e2e_s - r.ttft_s for r in ok if r.output_tokens > 1 and r.e2e_s is not None
                   and r.ttft_s is not None)
    return {"ttft_ms": sum(r.ttft_s for r in ok if r.ttft_s is not None) * 1000 / len(ok) if ok else math.nan,
            "tpot_ms": decode_s * 1000 / gaps if gaps else math.nan}


def as_sent(results: Sequence[RequestResult], workload: Sequence[TraceRequest], time_scale: float
            ) -> list[TraceRequest]:
    """The requests that were sent, as the simulator's workload: arrival at the send time on the
    engines' clock, the prompt length the engine counted, the output length asked for."""
    asked = {r.index: r for r in workload}
    out = []
    for r in results:
        req = asked[r.index]
        out.append(dataclasses.replace(req, arrival_s=r.sent_s / time_scale,
                                       prompt_tokens=r.prompt_tokens if r.ok else req.prompt_tokens))
    return sorted(out, key=lambda t: t.arrival_s)


def simulate_deployment(args: AppArgs, workload: Sequence[TraceRequest]) -> list[RequestResult]:
    """The deployment `args` describes (plan, classes, routing) through the offline simulator."""
    topology = resolve_topology(args, base=ROOT)
    plan = plan_for(args, topology)
    router = args.router

    def profile(name: str) -> Profile:
        p = router.profile(name)
        out = Profile(filters=tuple(p.filters), scorers=dict(p.scorers), picker=p.picker)
        check_profile(out)
        return out

    classes = router.classes()
    config = SimConfig(topology=topology, plan=plan, classes=classes, profiles={c: profile(c) for c in classes},
                       pd_enabled=router.pd.enabled, pd_min_prompt_tokens=router.pd.min_prompt_tokens,
                       scrape_interval_s=router.scrape_interval_s / args.time_scale, seed=router.seed,
                       model=next((p.model for p in args.pools if p.model), None))
    return simulate(config, workload).results
