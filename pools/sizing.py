"""Pool sizing: the prefill:decode split (TP sizes and replica counts) that maximises goodput
per GPU under the SLOs, from the cost model. DistServe's placement search is the reference:
size each phase separately against its own SLO, then match their rates.

- A prefill replica serves requests one prompt at a time; with Poisson arrivals its TTFT is
  an M/D/1 sojourn, t_p + rho * t_p / (2 (1 - rho)), plus the KV transfer. The largest load
  rho that keeps that within the TTFT target gives its goodput rho / t_p.
- A decode replica runs a batch b whose step time (weights + the batch's cache, plus TP
  all-reduces) must stay within the TPOT target and whose cache must fit; its goodput is
  b / (output tokens x step time).
- The split uses the island's bottleneck link for each TP size (from the topology), so a box
  without NVLink prices TP>1 at PCIe speed and the search prefers smaller TP there.
- An MoE model is also sized as expert-parallel gangs of `EP_SIZES` data-parallel ranks
  (`physics.moecost`): every rank prefills its own prompts and decodes its own batch, in lockstep
  with the gang; the all-to-all runs over NVLink when the largest domain holds the gang, else
  over rail-aligned RDMA between nodes. Prefill and decode are sized separately, so each phase
  gets its own EP size (DeepSeek's deployment: EP32 prefill, EP144 decode).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from physics import alltoall, catalog, costmodel, moecost
from physics.alltoall import GangLinks
from physics.catalog import GpuSpec, ModelSpec
from pools.model import SLOClass
from topology import Topology, bottleneck, cliques, islands

WORKLOADS: dict[str, tuple[int, int, str]] = {
    # name -> (mean prompt tokens, mean output tokens, source)
    "azure-conv": (1155, 211, "Azure LLM inference trace 2023, conversation (19,366 requests; means)"),
    "azure-code": (2048, 28, "Azure LLM inference trace 2023, code (8,819 requests; means)"),
}
TP_SIZES = (1, 2, 4, 8)
EP_SIZES = (2, 4, 8, 16, 32, 64, 72, 128, 144, 256)
"""Data-parallel ranks (one GPU each) of the expert-parallel gangs the search tries."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PhaseOption:
    role: str
    tp: int
    goodput_rps: float
    """Requests per second one replica sustains within the SLO."""
    detail: str
    dp: int = 1
    expert_parallel: bool = False

    @property
    def gpus(self) -> int:
        return self.tp * self.dp


@dataclass(frozen=True, slots=True, kw_only=True)
class SizingProposal:
    prefill: PhaseOption
    decode: PhaseOption
    prefill_replicas: int
    decode_replicas: int
    gpus: int
    goodput_rps: float
    goodput_per_gpu: float
    explanation: tuple[str, ...]


def parse_workload(text: str) -> tuple[int, int]:
    if text in WORKLOADS:
        return WORKLOADS[text][0], WORKLOADS[text][1]
    parts = text.split(":")
    if len(parts) == 2 and all(p.isdigit() and int(p) > 0 for p in parts):
        return int(parts[0]), int(parts[1])
    raise ValueError(f"workload {text!r}: give a preset ({', '.join(WORKLOADS)}) or PROMPT:OUTPUT tokens")


def best_link(topology: Topology, tp: int) -> costmodel.LinkCost | None:
    """The best TP group of this size the cluster offers: the fastest island that holds it."""
    best: costmodel.LinkCost | None = None
    groups = [list(i.gpus) for i in islands(topology) if i.fully_connected] + cliques(topology)
    for group in groups:
        if len(group) >= tp:
            cost = costmodel.LinkCost.of(bottleneck(topology, group[:tp]))
            if best is None or cost.bandwidth_gb_s > best.bandwidth_gb_s:
                best = cost
    if best is None:  # no island that large: the same node over PCIe at best
        for node in topology.nodes:
            if len(node.gpus) >= tp:
                refs = [r for r in topology.gpu_refs() if r.node == node.name][:tp]
                return costmodel.LinkCost.of(bottleneck(topology, refs))
    return best


def prefill_option(model: ModelSpec, gpu: GpuSpec, tp: int, link: costmodel.LinkCost, prompt: int,
                   ttft_ms: float, kv_ms: float) -> PhaseOption | None:
    t = costmodel.prefill_ms(model, gpu, tp, link, prompt)
    budget = ttft_ms - kv_ms
    if t >= budget:
        return None
    # t + rho t / (2 (1 - rho)) <= budget  ->  rho <= 2 (budget - t) / (2 budget - t)
    rho = min(0.95, 2 * (budget - t) / (2 * budget - t))
    return PhaseOption(role="prefill", tp=tp, goodput_rps=rho / (t / 1000.0),
                       detail=f"prefill {prompt} tokens in {t:.1f} ms at tp={tp}; load {rho:.2f} keeps TTFT "
                              f"<= {ttft_ms:g} ms")


def best_batch(step_ms: Callable[[int], float], capacity: int, per_request: int, output: int, tpot_ms: float
               ) -> tuple[float, int, float] | None:
    """The batch (doubling from 1, while its cache fits) whose step keeps within the TPOT target
    and serves the most requests per second: (requests/s, batch, step ms)."""
    best: tuple[float, int, float] | None = None
    batch = 1
    while batch <= 1024 and batch * per_request <= capacity:
        step = step_ms(batch)
        if step > tpot_ms:
            break
        rate = batch / (output * step / 1000.0)
        if best is None or rate > best[0]:
            best = (rate, batch, step)
        batch *= 2
    return best


def decode_option(model: ModelSpec, gpu: GpuSpec, tp: int, link: costmodel.LinkCost, prompt: int, output: int,
                  tpot_ms: float) -> PhaseOption | None:
    capacity = costmodel.kv_capacity_tokens(model, gpu, tp)
    per_request = prompt + output // 2
    best = best_batch(lambda b: costmodel.decode_step_ms(model, gpu, tp, link, b, b * per_request), capacity,
                      per_request, output, tpot_ms)
    if best is None:
        return None
    rate, batch, step = best
    return PhaseOption(role="decode", tp=tp, goodput_rps=rate,
                       detail=f"decode batch {batch} at {step:.1f} ms/token (TPOT <= {tpot_ms:g} ms, cache "
                              f"{capacity} tokens) at tp={tp}")


def mixed_option(model: ModelSpec, gpu: GpuSpec, tp: int, link: costmodel.LinkCost, prompt: int, output: int,
                 ttft_ms: float, tpot_ms: float) -> PhaseOption | None:
    """A mixed replica (chunked prefill: prompts and decodes share its steps) at `rate` requests
    per second spends rho = rate x t_p of its time prefilling; its decodes advance in the rest, so
    a request's TPOT is step(b) / (1 - rho) with b = rate x output x TPOT sequences decoding
    (Little's law), and its TTFT is the prefill's M/D/1 sojourn stretched the same way. The
    largest rate that keeps both within the targets and the batch within the cache."""
    t_p = costmodel.prefill_ms(model, gpu, tp, link, prompt) / 1000.0
    capacity = costmodel.kv_capacity_tokens(model, gpu, tp)
    per_request = prompt + output // 2

    def latencies(rate: float) -> tuple[float, float] | None:
        rho = rate * t_p
        if rho >= 0.95:
            return None
        tpot = 0.0
        for _ in range(30):  # the batch and the step time settle together
            batch = max(1, math.ceil(rate * output * tpot))
            if batch * per_request > capacity:
                return None
            tpot = costmodel.decode_step_ms(model, gpu, tp, link, batch, batch * per_request) / 1000.0 / (1 - rho)
        ttft = (t_p + rho * t_p / (2 * (1 - rho))) / (1 - rho) + tpot
        return ttft * 1000.0, tpot * 1000.0

    def fits(rate: float) -> bool:
        got = latencies(rate)
        return got is not None and got[0] <= ttft_ms and got[1] <= tpot_ms

    if not fits(1e-6):
        return None
    low, high = 0.0, 0.95 / t_p
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    ttft, tpot = latencies(low) or (0.0, 0.0)
    return PhaseOption(role="mixed", tp=tp, goodput_rps=low,
                       detail=f"mixed at {low:.2f} req/s: prefill {t_p * 1000:.1f} ms a prompt ({low * t_p:.0%} of "
                              f"the time), TPOT {tpot:.1f} ms, TTFT {ttft:.0f} ms at tp={tp}")


def size(topology: Topology, model_name: str, workload: str, slos: list[SLOClass],
         gpu_name: str | None = None, prefill_tp: int | None = None, decode_tp: int | None = None,
         prefill_dp: int | None = None, decode_dp: int | None = None) -> SizingProposal:
    """`prefill_tp` / `decode_tp` fix a phase's TP size (a pools file says it), `prefill_dp` /
    `decode_dp` its expert-parallel gang's ranks; else they are searched."""
    return candidates(topology, model_name, workload, slos, gpu_name, prefill_tp, decode_tp, every=False,
                      prefill_dp=prefill_dp, decode_dp=decode_dp)[0]


def gang_links(topology: Topology, ranks: int) -> GangLinks:
    """Where a gang of `ranks` GPUs runs its all-to-all at best: inside the largest NVLink domain
    when it holds them, else across nodes of that domain's size over rail-aligned RDMA."""
    domains = sorted(islands(topology), key=lambda i: (-i.size, -i.bottleneck_gb_s))
    top = domains[0]
    nvlink = max(top.bottleneck_gb_s, 1.0)
    if top.size >= ranks:
        return GangLinks(carrier="nvlink", domain_ranks=ranks, nvlink_gb_s=nvlink)
    return GangLinks(carrier="rdma", domain_ranks=max(top.size, 1), nvlink_gb_s=nvlink,
                     nic_gb_s=topology.fabric.nic_bandwidth_gb_s, nic_latency_us=topology.fabric.latency_us,
                     gpu_initiated=alltoall.gpu_initiated(topology.fabric.technology))


def gang_options(topology: Topology, model: ModelSpec, gpu: GpuSpec, prompt: int, output: int, ttft_ms: float,
                 tpot_ms: float, total: int, prefill_dp: int | None, decode_dp: int | None
                 ) -> tuple[list[PhaseOption], list[PhaseOption]]:
    """Expert-parallel gangs (tp=1 ranks) of each size in `EP_SIZES` whose experts fit (module docstring)."""
    prefills: list[PhaseOption] = []
    decodes: list[PhaseOption] = []
    for dp in sorted(set(EP_SIZES) | {d for d in (prefill_dp, decode_dp) if d}):
        if dp > total or not costmodel.fits(model, gpu.memory_gb, 1, ep=dp):
            continue
        links = gang_links(topology, dp)
        if prefill_dp in (None, dp):
            t = moecost.moe_step(model, gpu, 1, dp, links, prefill_tokens=prompt).total_ms
            if t < ttft_ms:
                rho = min(0.95, 2 * (ttft_ms - t) / (2 * ttft_ms - t))
                prefills.append(PhaseOption(role="prefill", tp=1, dp=dp, expert_parallel=True,
                                            goodput_rps=dp * rho / (t / 1000.0),
                                            detail=f"EP{dp} prefill of {prompt} tokens per rank in {t:.1f} ms over "
                                                   f"{links.carrier}; load {rho:.2f} keeps TTFT <= {ttft_ms:g} ms"))
        if decode_dp in (None, dp):
            d = _gang_decode(model, gpu, dp, links, prompt, output, tpot_ms)
            if d is not None:
                decodes.append(d)
    return prefills, decodes


def _gang_decode(model: ModelSpec, gpu: GpuSpec, dp: int, links: GangLinks, prompt: int, output: int,
                 tpot_ms: float) -> PhaseOption | None:
    capacity = costmodel.kv_capacity_tokens(model, gpu, 1, ep=dp)
    per_request = prompt + output // 2
    best = best_batch(lambda b: moecost.moe_step(model, gpu, 1, dp, links, decodes=b, decode_context=per_request)
                      .total_ms, capacity, per_request, output, tpot_ms)
    if best is None:
        return None
    rate, batch, step = best
    rate *= dp
    return PhaseOption(role="decode", tp=1, dp=dp, expert_parallel=True, goodput_rps=rate,
                       detail=f"EP{dp} decode batch {batch} per rank at {step:.1f} ms/token over {links.carrier} "
                              f"(TPOT <= {tpot_ms:g} ms, cache {capacity} tokens per rank)")


def candidates(topology: Topology, model_name: str, workload: str, slos: list[SLOClass],
               gpu_name: str | None = None, prefill_tp: int | None = None, decode_tp: int | None = None,
               every: bool = True, prefill_dp: int | None = None, decode_dp: int | None = None
               ) -> list[SizingProposal]:
    """Every TP combination's best split, best goodput per GPU first (the simulator can check
    them: `python -m loadtest size --refine`)."""
    model = catalog.model(model_name)
    gpu_name = gpu_name or next((g.model for n in topology.nodes for g in n.gpus if g.model), None)
    if gpu_name is None:
        raise ValueError("the topology does not name its GPU model; pass --gpu")
    gpu = catalog.gpu(gpu_name)
    prompt, output = parse_workload(workload)
    ttft = min(s.ttft_ms for s in slos)
    tpot = min(s.tpot_ms for s in slos)
    total = sum(1 for r in topology.gpu_refs()
                if topology.gpu(r).healthy and topology.gpu(r).model in (None, gpu_name))
    kv_ms = prompt * model.kv_bytes_per_token() / 450e9 * 1e3  # NVLink pair in one island
    prefills, decodes = [], []
    for tp in sorted(set(TP_SIZES) | {t for t in (prefill_tp, decode_tp) if t}):
        link = best_link(topology, tp)
        if link is None or not costmodel.fits(model, gpu.memory_gb, tp):
            continue
        if prefill_dp is None and prefill_tp in (None, tp) and (
                p := prefill_option(model, gpu, tp, link, prompt, ttft, kv_ms)) is not None:
            prefills.append(p)
        if decode_dp is None and decode_tp in (None, tp) and (
                d := decode_option(model, gpu, tp, link, prompt, output, tpot)) is not None:
            decodes.append(d)
    if model.moe is not None:
        gp, gd = gang_options(topology, model, gpu, prompt, output, ttft, tpot, total, prefill_dp, decode_dp)
        prefills += [] if prefill_tp not in (None, 1) and prefill_dp is None else gp
        decodes += [] if decode_tp not in (None, 1) and decode_dp is None else gd
    if not prefills or not decodes:
        raise ValueError(f"no TP size of {model_name} on {gpu_name} meets TTFT {ttft:g} ms and TPOT {tpot:g} ms "
                         f"for {prompt}:{output} tokens")
    ranked = sorted((q for p in prefills for d in decodes if (q := _split(p, d, total)) is not None),
                    key=lambda q: -q.goodput_per_gpu)
    if not ranked:
        raise ValueError(f"{total} GPUs cannot hold one prefill and one decode replica")
    return ranked if every else ranked[:1]


def _split(p: PhaseOption, d: PhaseOption, total_gpus: int) -> SizingProposal | None:
    best: SizingProposal | None = None
    for n_p in range(1, total_gpus // p.gpus + 1):
        left = total_gpus - n_p * p.gpus
        n_d = min(left // d.gpus, max(1, round(n_p * p.goodput_rps / d.goodput_rps + 0.4999)))
        if n_d < 1:
            break
        rate = min(n_p * p.goodput_rps, n_d * d.goodput_rps)
        gpus = n_p * p.gpus + n_d * d.gpus
        if best is None or rate > best.goodput_rps or (rate == best.goodput_rps and gpus < best.gpus):
            why = (p.detail, d.detail,
                   f"{n_p} prefill x {p.goodput_rps:.2f} req/s vs {n_d} decode x {d.goodput_rps:.2f} req/s: "
                   f"{rate:.2f} req/s on {gpus} GPUs")
            best = SizingProposal(prefill=p, decode=d, prefill_replicas=n_p, decode_replicas=n_d, gpus=gpus,
                                  goodput_rps=rate, goodput_per_gpu=rate / gpus, explanation=why)
    return best
