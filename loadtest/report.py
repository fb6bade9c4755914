"""The comparison report: a markdown page someone who never saw the code can read (what was run,
the verdict in words with the reason — which replicas crossed which links and what that cost —
then the tables) and PNG plots (goodput against rate, latency per tier, SLO attainment)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadtest.chartstyle import bar_style, legend_outside, pyplot, series_style
from loadtest.scaling_report import section

if TYPE_CHECKING:
    from loadtest.scenario import Scenario


def _f(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:,.{digits}f}"


def _ratio(a: float, b: float) -> str:
    if b <= 0:
        return "∞" if a > 0 else "–"
    return f"{a / b:.2f}x"


def verdict(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The finding in words, at each rate: the best policy, by how much, and why (tiers)."""
    lines = []
    for rate in sorted({r["rate_scale"] for r in rows}):
        at = sorted((r for r in rows if r["rate_scale"] == rate), key=lambda r: -r["goodput_rps"])
        best, rest = at[0], at[1:]
        if not rest:
            continue
        others = ", ".join(f"{r['policy']} {_f(r['goodput_rps'], 2)} req/s "
                           f"({_ratio(best['goodput_rps'], r['goodput_rps'])})" for r in rest)
        lines.append(f"- At x{rate:g} the offered rate ({_f(best['rate_rps'], 2)} req/s), **{best['policy']}** had the "
                     f"most goodput: {_f(best['goodput_rps'], 2)} req/s met their class's TTFT and TPOT targets, "
                     f"against {others}.")
        for r in rest:
            crossing = r["plan"]["crossing"]
            if crossing:
                tiers = ", ".join(f"{n} on {t}" for t, n in sorted(r["plan"]["tp_tiers"].items()))
                named = ", ".join(crossing[:6]) + ("…" if len(crossing) > 6 else "")
                lines.append(f"  - {r['policy']} put {len(crossing)} of {r['plan']['placed']} replicas' "
                             f"tensor-parallel groups across islands ({named}; TP groups by tier: {tiers}).")
            lines.append(f"  - Where requests ran (the tier of their TP group, or of the KV path for a "
                         f"prefill/decode pair): {r['policy']}: {_tier_mix(r)}; {best['policy']}: {_tier_mix(best)}.")
            if r["plan"]["unplaced"]:
                lines.append(f"  - {r['policy']} left {r['plan']['unplaced']} replicas unplaced.")
    return lines or ["- Only one policy ran: nothing to compare."]


def _tier_mix(row: Mapping[str, Any]) -> str:
    tiers = row["summary"]["per_tier"]
    total = sum(t["requests"] for t in tiers.values()) or 1
    parts = sorted(tiers.items(), key=lambda kv: -kv[1]["requests"])
    return ", ".join(f"{name} {t['requests'] / total:.0%} (TTFT p50 {_f(t['ttft_ms']['median'])} ms, TPOT p50 "
                     f"{_f(t['tpot_ms']['median'])} ms)" for name, t in parts[:3]) or "no completed requests"


def _shape(tp: int, dp: int, pp: int, ep: bool) -> str:
    return f"TP={tp}" + (f" DP={dp}" if dp > 1 else "") + (f" PP={pp}" if pp > 1 else "") + (
        f" EP{tp * dp}" if ep else "")


def _gang_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each policy's gangs: where their all-to-all runs and its share of a decode step."""
    seen: set[str] = set()
    lines: list[str] = []
    for r in rows:
        gangs = r["plan"].get("gangs") or []
        if r["policy"] in seen or not gangs:
            continue
        seen.add(r["policy"])
        lines += [f"| {r['policy']} | {g['replica']} | {g['shape']} | {g['carrier']} | {g['nodes']} | "
                  f"{_f(g['a2a_share'] * 100 if g['a2a_share'] is not None else math.nan)} % | "
                  f"{_f(g['step_ms'])} |" for g in gangs]
    if not lines:
        return []
    return ["", "## Gangs", "",
            "Where each gang's all-to-all runs (`nvlink`: inside one NVLink domain; `rdma`: across nodes "
            "on the same rails; `cross-rail`: across racks or rails, through the spine) and, from the cost "
            "model, its share of a decode step of 64 sequences per rank with 1,024 tokens of context each.", "",
            "| policy | gang | shape | all-to-all over | nodes | all-to-all share | decode step ms |",
            "|---|---|---|---|---:|---:|---:|", *lines]


def write_report(scenario: Scenario, rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    topo = scenario.topology
    gpus = sum(len(n.gpus) for n in topo.nodes)
    classes = scenario.classes()
    first = rows[0] if rows else None
    out = [f"# Placement policies compared: {scenario.name}", ""]
    if scenario.config.description:
        out += [scenario.config.description.strip(), ""]
    out += ["- **Mode:** simulated (the product's placement policies, router decisions and continuous batching on "
            "a virtual clock; engine timings from the cost model, KV transfers sharing links and NICs).",
            f"- **Topology:** `{scenario.config.topology}` — {len(topo.nodes)} nodes, {gpus} GPUs, fingerprint "
            f"`{topo.fingerprint()}`.",
            "- **Pools:** " + "; ".join(f"{p.name} ({p.role}, {_shape(p.tp, p.dp, p.pp, p.expert_parallel)}, "
                                        f"{p.replicas} replicas, {p.model})" for p in scenario.config.pools) + ".",
            f"- **Workload:** `{scenario.config.workload}`"
            + (f", {first['summary']['requests']} requests per run" if first else "") + ".",
            "- **SLO classes:** " + "; ".join(f"{c.name} (TTFT ≤ {c.ttft_ms:g} ms, TPOT ≤ {c.tpot_ms:g} ms)"
                                              for c in classes.values()) + ".",
            "- **Goodput** counts requests per second that completed within their class's TTFT and TPOT targets.",
            ""]
    if scenario.config.held:
        out += ["- **GPUs held by other work** (replica churn): " + "; ".join(
            f"{h.node} {h.gpus}" for h in scenario.config.held) + ".", ""]
    if scenario.config.faults:
        out += ["- **Faults:** " + "; ".join(f"{f.kind} on {' -> '.join(f.pair) or f.node} {f.gpus or ''} at "
                                             f"{f.at_s:g} s" for f in scenario.config.faults) + ".", ""]
    out += ["## Verdict", "", *verdict(rows), "", *section(rows, list(classes)), "## Results", "",
            "| rate | policy | offered req/s | goodput req/s | output tok/s per GPU at SLO | "
            + " | ".join(f"{c} SLO met" for c in classes) + " | TTFT p50 / p99 ms | TPOT p50 / p99 ms | completed |",
            "|---|---|---:|---:|---:|" + "---:|" * len(classes) + "---:|---:|---:|"]
    for r in rows:
        s = r["summary"]
        att = [(_f(r["slo_attainment"].get(c, math.nan) * 100, 1) + " %") if c in r["slo_attainment"] else "–"
               for c in classes]
        out.append(f"| x{r['rate_scale']:g} | {r['policy']} | {_f(r['rate_rps'], 2)} | {_f(r['goodput_rps'], 2)} | "
                   f"{_f(r.get('output_tokens_per_gpu_s', math.nan))} | "
                   + " | ".join(att) + f" | {_f(s['ttft_ms']['median'])} / {_f(s['ttft_ms']['p99'])} | "
                   f"{_f(s['tpot_ms']['median'])} / {_f(s['tpot_ms']['p99'])} | {s['completed']}/{s['requests']} |")
    out += _gang_table(rows)
    out += ["", "## Latency by topology tier", "",
            "The tier is the worst link a request's work crossed: a replica's tensor-parallel group, or for a "
            "prefill/decode pair the KV path. From best to worst: `local` (one GPU, or a KV cache that stays "
            "on its GPUs), `nvlink`, `pcie` (PCIe inside one CPU socket), `numa` (across CPU sockets), then "
            "the network: `rdma`, `tcp`, `rack` (between racks).", "",
            "| rate | policy | tier | requests | TTFT p50 / p99 ms | TPOT p50 / p99 ms |",
            "|---|---|---|---:|---:|---:|"]
    for r in rows:
        for tier, t in r["summary"]["per_tier"].items():
            out.append(f"| x{r['rate_scale']:g} | {r['policy']} | {tier} | {t['requests']} | "
                       f"{_f(t['ttft_ms']['median'])} / {_f(t['ttft_ms']['p99'])} | "
                       f"{_f(t['tpot_ms']['median'])} / {_f(t['tpot_ms']['p99'])} |")
    out += ["", "## Placements", "", "| policy | placed | unplaced | inside one island | TP groups by tier |",
            "|---|---:|---:|---:|---|"]
    seen = set()
    for r in rows:
        if r["policy"] in seen:
            continue
        seen.add(r["policy"])
        p = r["plan"]
        out.append(f"| {r['policy']} | {p['placed']} | {p['unplaced']} | {p['in_island']} | "
                   + ", ".join(f"{t}: {n}" for t, n in sorted(p["tp_tiers"].items())) + " |")
    events = [(r["policy"], e) for r in rows for e in r["events"]]
    if events:
        out += ["", "## Faults and what the health loop did", ""]
        out += [f"- {pol}: t={e['t']} s {e['event']} " + " ".join(f"{k}={v}" for k, v in e.items()
                                                                 if k not in ("t", "event")) for pol, e in events[:40]]
    out += ["", "Plots: `goodput_vs_rate.png`, `latency_by_tier.png`, `slo_attainment.png`. Raw figures: "
            "`results.jsonl` (one line per policy and rate).", ""]
    path.write_text("\n".join(out))


def goodput_figure(rows: Sequence[Mapping[str, Any]]) -> Any:
    """Goodput against offered load, a line per policy (styles: loadtest.chartstyle)."""
    plt = pyplot()
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for k, pol in enumerate(policies):
        mine = sorted((r for r in rows if r["policy"] == pol), key=lambda r: r["rate_rps"])
        ax.plot([r["rate_rps"] for r in mine], [r["goodput_rps"] for r in mine], label=pol,
                **series_style(k, len(policies)))
    ax.set_xlabel("offered load (requests/s)")
    ax.set_ylabel("goodput (requests/s meeting their SLO)")
    ax.set_title("Goodput against offered load, per placement policy")
    ax.grid(alpha=0.3)
    legend_outside(ax, title="policy")
    fig.tight_layout()
    return fig


def latency_figure(rows: Sequence[Mapping[str, Any]]) -> Any:
    """TTFT and TPOT p50/p99 per policy and tier at the top rate: horizontal bars, one row per
    (policy, tier), so the row names never crowd each other however many there are."""
    plt = pyplot()
    top = max(r["rate_scale"] for r in rows)
    at = [r for r in rows if r["rate_scale"] == top]
    names = [f"{r['policy']} · {tier}" for r in at for tier in r["summary"]["per_tier"]]
    fig, axes = plt.subplots(1, 2, figsize=(11, 1.4 + 0.42 * max(len(names), 3)), sharey=True)
    ys = list(range(len(names)))[::-1]
    for ax, key, title in ((axes[0], "ttft_ms", "TTFT"), (axes[1], "tpot_ms", "TPOT")):
        tiers = [t for r in at for t in r["summary"]["per_tier"].values()]
        ax.barh([y + 0.2 for y in ys], [_num(t[key]["median"]) for t in tiers], height=0.4, label="p50",
                **bar_style(0))
        ax.barh([y - 0.2 for y in ys], [_num(t[key]["p99"]) for t in tiers], height=0.4, label="p99",
                **bar_style(1))
        ax.set_yticks(ys, names)
        ax.set_xlabel(f"{title} (ms)")
        ax.set_title(f"{title} by topology tier (rate x{top:g})")
        ax.grid(alpha=0.3, axis="x")
    legend_outside(axes[1])
    fig.tight_layout()
    return fig


def attainment_figure(rows: Sequence[Mapping[str, Any]]) -> Any:
    """SLO attainment per class at the top rate, a bar per policy."""
    plt = pyplot()
    top = max(r["rate_scale"] for r in rows)
    at = [r for r in rows if r["rate_scale"] == top]
    classes = sorted({c for r in at for c in r["slo_attainment"]})
    fig, ax = plt.subplots(figsize=(max(7.0, 1.2 + 0.35 * len(classes) * len(at)), 4.5))
    width = 0.8 / max(len(at), 1)
    for i, r in enumerate(at):
        ax.bar([j + i * width for j in range(len(classes))],
               [_num(r["slo_attainment"].get(c, math.nan)) * 100 for c in classes], width=width, label=r["policy"],
               **bar_style(i))
    ax.set_xticks([j + width * (len(at) - 1) / 2 for j in range(len(classes))], classes)
    ax.set_ylabel("requests meeting their SLO (%)")
    ax.set_ylim(0, 105)
    ax.set_title(f"SLO attainment per class (rate x{top:g})")
    legend_outside(ax, title="policy")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return fig


def write_plots(rows: Sequence[Mapping[str, Any]], out: Path) -> None:
    plt = pyplot()
    for name, build in (("goodput_vs_rate.png", goodput_figure), ("latency_by_tier.png", latency_figure),
                        ("slo_attainment.png", attainment_figure)):
        fig = build(rows)
        fig.savefig(out / name, dpi=110, bbox_inches="tight")
        plt.close(fig)


def _num(v: Any) -> float:
    return 0.0 if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)
