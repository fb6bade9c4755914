"""`python -m loadtest size --refine`: pool sizing's candidates (`pools.sizing.candidates`, from the
cost model's queueing estimates) checked in the offline simulator: each prefill:decode split is
placed island-aligned and driven with the same trace at the rate sizing promised; the one with
the most simulated goodput per GPU wins, and the table says how far each estimate was off."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from loadtest.model import TraceRequest
from loadtest.sim.cluster import simulate
from loadtest.sim.model import SimConfig
from loadtest.summary import summarize
from pools.model import DEFAULT_SLO_CLASSES, PlacementRequest, PoolSpec, SLOClass
from pools.placement import get_policy
from pools.sizing import SizingProposal, candidates
from topology import Topology, read_source
from topology.readers import ReadOptions

TRACES = {"azure-conv": "azure-conv", "azure-code": "azure-code"}


def _workload(name: str, rate_rps: float, duration_s: float, classes: Sequence[str], seed: int
              ) -> list[TraceRequest]:
    from loadtest.workload import load_workload

    mix = {c: 1.0 for c in classes}
    if name in TRACES:
        base = load_workload({"trace": TRACES[name], "seed": seed})
        span = max(r.arrival_s for r in base.requests) or 1.0
        scale = rate_rps / (len(base.requests) / span)
        spec: dict[str, Any] = {"trace": TRACES[name], "rate_scale": scale, "duration_s": duration_s,
                                "class_mix": mix, "seed": seed}
    else:
        prompt, _, output = name.partition(":")
        spec = {"synthetic": {"arrival": "poisson", "rate": rate_rps, "prompt": int(prompt), "output": int(output)},
                "duration_s": duration_s, "class_mix": mix, "seed": seed}
    return list(load_workload(spec).requests)


def check(topology: Topology, model: str, proposal: SizingProposal, workload: Sequence[TraceRequest],
          classes: dict[str, SLOClass], seed: int) -> dict[str, Any]:
    pools = (PoolSpec(name="prefill", role="prefill", tp=proposal.prefill.tp, replicas=proposal.prefill_replicas,
                      model=model),
             PoolSpec(name="decode", role="decode", tp=proposal.decode.tp, replicas=proposal.decode_replicas,
                      model=model))
    plan = get_policy("island-aligned").place(PlacementRequest(topology=topology, pools=pools, slo_classes=classes,
                                                               seed=seed))
    result = simulate(SimConfig(topology=topology, plan=plan, classes=classes, pd_min_prompt_tokens=0, seed=seed),
                      workload)
    span = max((r.arrival_s for r in workload), default=1.0)
    summary = summarize(result.results, classes, span)  # goodput over the offered window
    return {"prefill": {"tp": proposal.prefill.tp, "replicas": proposal.prefill_replicas},
            "decode": {"tp": proposal.decode.tp, "replicas": proposal.decode_replicas}, "gpus": proposal.gpus,
            "estimated_goodput_rps": round(proposal.goodput_rps, 3),
            "simulated_goodput_rps": summary["goodput_rps"],
            "simulated_goodput_per_gpu": round(summary["goodput_rps"] / proposal.gpus, 4),
            "slo_attainment": summary["slo_attainment"], "ttft_p99_ms": summary["ttft_ms"]["p99"],
            "tpot_p99_ms": summary["tpot_ms"]["p99"], "unplaced": len(plan.unplaced)}


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest size", description=__doc__)
    parser.add_argument("--topology", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--workload", required=True, help="azure-conv, azure-code or PROMPT:OUTPUT tokens")
    parser.add_argument("--slo", required=True, help="SLO class names, comma separated")
    parser.add_argument("--gpu")
    parser.add_argument("--refine", action="store_true", help="simulate the candidates (else: the estimate only)")
    parser.add_argument("--candidates", type=int, default=4)
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of traffic per candidate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--format", choices=["json", "text"], default="text")
    args = parser.parse_args(argv)
    topology = read_source(args.topology, ReadOptions(gpu=args.gpu))
    known = {c.name: c for c in DEFAULT_SLO_CLASSES}
    names = [s.strip() for s in args.slo.split(",") if s.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        parser.error(f"--slo: unknown classes {unknown} (known: {', '.join(known)})")
    classes = {n: known[n] for n in names}
    proposals = candidates(topology, args.model, args.workload, list(classes.values()), args.gpu)
    proposals = proposals[: max(1, args.candidates if args.refine else 1)]
    rows: list[dict[str, Any]] = []
    for p in proposals:
        if not args.refine:
            rows.append({"prefill": {"tp": p.prefill.tp, "replicas": p.prefill_replicas},
                         "decode": {"tp": p.decode.tp, "replicas": p.decode_replicas}, "gpus": p.gpus,
                         "estimated_goodput_rps": round(p.goodput_rps, 3)})
            continue
        workload = _workload(args.workload, p.goodput_rps, args.duration, names, args.seed)
        rows.append(check(topology, args.model, p, workload, classes, args.seed))
    best = max(rows, key=lambda r: float(r.get("simulated_goodput_per_gpu", 0.0))) if args.refine else rows[0]
    if args.format == "json":
        print(json.dumps({"best": best, "candidates": rows}, indent=2))
        return 0
    for r in rows:
        mark = "*" if r is best else " "
        line = (f"{mark} prefill tp={r['prefill']['tp']} x {r['prefill']['replicas']}, decode tp={r['decode']['tp']} x "
                f"{r['decode']['replicas']} ({r['gpus']} GPUs): estimated {r['estimated_goodput_rps']:.2f} req/s")
        if args.refine:
            line += (f", simulated {r['simulated_goodput_rps']:.2f} req/s "
                     f"({r['simulated_goodput_per_gpu']:.3f} per GPU, SLO met {r['slo_attainment']:.0%}, "
                     f"TTFT p99 {r['ttft_p99_ms']:.0f} ms)")
        print(line)
    if args.refine:
        print("* best by simulated goodput per GPU")
    return 0
