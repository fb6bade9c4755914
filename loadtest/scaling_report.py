"""Autoscalers compared (`python -m loadtest compare SCENARIO --autoscalers static,blind,topology`):
the figures each row carries beyond the placement comparison's (attainment over the whole run and
at the peak of the load step, GPU-hours, the replica timeline), the report's section with the
verdict against static sizing, and its plots."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from loadtest.chartstyle import bar_style, legend_outside, pyplot, series_style
from loadtest.model import RequestResult
from loadtest.summary import met_slo
from pools.model import PlacementPlan, SLOClass

GPU_HOURS_BAR = 0.70
ATTAINMENT_POINTS_BAR = 0.05
"""The issue's bar: within 5 points of static sizing's interactive attainment on at most 70 % of
its GPU-hours."""


def peak_window(workload: Mapping[str, Any]) -> tuple[float, float] | None:
    """The segment of a `rate_steps` workload with the largest factor: [start_s, end_s)."""
    steps = workload.get("rate_steps")
    if not steps:
        return None
    ends = [float(s[0]) for s in steps[1:]] + [float(workload.get("duration_s") or math.inf)]
    best = max(range(len(steps)), key=lambda i: (float(steps[i][1]), -i))
    return float(steps[best][0]), ends[best]


def attainment_between(results: Sequence[RequestResult], classes: Mapping[str, SLOClass], start_s: float,
                       end_s: float) -> dict[str, float]:
    """Per class, the share of the requests sent in [start_s, end_s) that met their targets."""
    out: dict[str, float] = {}
    for name in sorted({r.slo_class for r in results}):
        mine = [r for r in results if r.slo_class == name and start_s <= r.sent_s < end_s]
        if mine:
            out[name] = round(sum(1 for r in mine if met_slo(r, classes.get(name))) / len(mine), 4)
    return out


def row_figures(results: Sequence[RequestResult], classes: Mapping[str, SLOClass], workload: Mapping[str, Any],
                timeline: Sequence[Mapping[str, Any]], plan: PlacementPlan, duration_s: float) -> dict[str, Any]:
    """What an autoscaler row adds: `attainment_peak` and `peak_s` (with a load step), and the
    timeline (a static run's: its plan throughout)."""
    out: dict[str, Any] = {}
    peak = peak_window(workload)
    if peak is not None:
        out["peak_s"] = [peak[0], peak[1] if math.isfinite(peak[1]) else duration_s]
        out["attainment_peak"] = attainment_between(results, classes, *peak)
    if not timeline:
        timeline = [{"t": t, "pool": p.name, "replicas": sum(1 for x in plan.placements if x.pool == p.name),
                     "serving": sum(1 for x in plan.placements if x.pool == p.name), "gpus": plan.gpus_used}
                    for t in (0.0, round(duration_s, 3)) for p in plan.pools]
    out["timeline"] = list(timeline)
    return out


def verdict(rows: Sequence[Mapping[str, Any]], focus: str = "interactive") -> list[str]:
    """The topology-aware autoscaler against static sizing (the bar) and the topology-blind one."""
    by = {r["autoscaler"]: r for r in rows if "autoscaler" in r}
    static, topo, blind = by.get("static"), by.get("topology"), by.get("blind")
    if static is None or topo is None:
        return ["- Static sizing and the topology-aware autoscaler are both needed for a verdict."]
    lines = []
    share = topo["gpu_hours"] / static["gpu_hours"] if static["gpu_hours"] > 0 else math.inf
    for key, where in (("attainment", "over the whole run"), ("attainment_peak", "at the peak")):
        if key not in topo or focus not in topo[key] or focus not in static.get(key, {}):
            continue
        gap = static[key][focus] - topo[key][focus]
        behind = f"{gap * 100:.1f} points behind" if gap >= 0 else f"{-gap * 100:.1f} points ahead"
        lines.append(f"- {focus} attainment {where}: topology {topo[key][focus]:.1%}, static {static[key][focus]:.1%} "
                     f"({behind}; bar: at most {ATTAINMENT_POINTS_BAR * 100:g} behind)"
                     + (f", blind {blind[key][focus]:.1%}" if blind is not None and focus in blind.get(key, {}) else "")
                     + ".")
    lines.append(f"- GPU-hours: topology {topo['gpu_hours']:.2f}, {share:.0%} of static's {static['gpu_hours']:.2f} "
                 f"(bar: at most {GPU_HOURS_BAR:.0%})"
                 + (f"; blind {blind['gpu_hours']:.2f}" if blind is not None else "") + ".")
    for key, where in (("attainment", "over the whole run"), ("attainment_peak", "at the peak")):
        if key not in topo or focus not in topo[key]:
            continue
        mine, theirs = topo[key][focus], static.get(key, {}).get(focus, 0.0)
        met = share <= GPU_HOURS_BAR and theirs - mine <= ATTAINMENT_POINTS_BAR and (
            blind is None or mine > blind.get(key, {}).get(focus, 0.0))
        lines.append(f"- The bar {where}: {'met' if met else 'not met'}.")
    return lines


def section(rows: Sequence[Mapping[str, Any]], classes: Sequence[str]) -> list[str]:
    """The report's autoscaling section."""
    auto = [r for r in rows if "autoscaler" in r]
    if not auto:
        return []
    out = ["## Autoscalers", "",
           "`static`: the scenario's replica counts throughout (sized for the peak). `blind`: the autoscaling "
           "policy placing new replicas with first-fit and removing the newest first. `topology`: the same "
           "policy placing with the scenario's placement policy and removing the replica on the worst links "
           "first. GPU-hours count every GPU a replica holds, from the decision to start it until it is "
           "released after draining.", "", *verdict(auto), "",
           "| autoscaler | " + " | ".join(f"{c} SLO met (peak)" for c in classes)
           + " | GPU-hours | scale events | TPOT p99 ms |",
           "|---|" + "---:|" * len(classes) + "---:|---:|---:|"]
    for r in auto:
        peak = r.get("attainment_peak", {})
        cells = [f"{r['attainment'].get(c, math.nan):.1%} ({peak[c]:.1%})" if c in peak else
                 f"{r['attainment'].get(c, math.nan):.1%}" for c in classes]
        out.append(f"| {r['autoscaler']} | " + " | ".join(cells) + f" | {r['gpu_hours']:.2f} | {r['scale_events']} | "
                   f"{r['tpot_p99_ms']:.1f} |")
    out += ["", "Plots: `autoscaling_replicas.png` (replicas serving over time), `autoscaling_summary.png` "
            "(attainment and GPU-hours).", ""]
    return out


def replicas_figure(auto: Sequence[Mapping[str, Any]]) -> Any:
    """Replicas serving over time, a stepped line per autoscaler (and pool), styled apart
    (loadtest.chartstyle) so that coinciding steps stay visible."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    series = [(r, pool, len(pools) > 1) for r in auto for pools in [sorted({p["pool"] for p in r["timeline"]})]
              for pool in pools]
    for k, (r, pool, named) in enumerate(series):
        points = [p for p in r["timeline"] if p["pool"] == pool]
        label = r["autoscaler"] + (f" {pool}" if named else "")
        every = max(1, len(points) // 8)
        ax.plot([p["t"] for p in points], [p["serving"] for p in points], drawstyle="steps-post", label=label,
                markevery=(min(k * every // max(len(series), 1), len(points) - 1), every),
                **series_style(k, len(series)))
    peak = next((r["peak_s"] for r in auto if "peak_s" in r), None)
    if peak is not None:
        ax.axvspan(peak[0], peak[1], color="grey", alpha=0.12, label="peak of the load step")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("replicas serving")
    ax.set_title("Replicas serving over the load step, per autoscaler")
    ax.grid(alpha=0.3)
    legend_outside(ax)
    fig.tight_layout()
    return fig


def summary_figure(auto: Sequence[Mapping[str, Any]]) -> Any:
    """SLO attainment per class (bars; a black tick: at the peak) and GPU-hours, per autoscaler."""
    plt = pyplot()
    classes = sorted({c for r in auto for c in r["attainment"]})
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    width = 0.8 / max(len(auto), 1)
    for i, r in enumerate(auto):
        xs = [j + i * width for j in range(len(classes))]
        left.bar(xs, [r["attainment"].get(c, 0.0) * 100 for c in classes], width=width, label=f"{r['autoscaler']}",
                 **bar_style(i))
        if "attainment_peak" in r:
            left.scatter(xs, [r["attainment_peak"].get(c, 0.0) * 100 for c in classes], color="black", marker="_",
                         s=200, zorder=3, label="at the peak" if i == 0 else None)
    left.set_xticks([j + width * (len(auto) - 1) / 2 for j in range(len(classes))], classes)
    left.set_ylabel("requests meeting their SLO (%)")
    left.set_ylim(0, 105)
    left.set_title("SLO attainment per class")
    left.grid(alpha=0.3, axis="y")
    for i, r in enumerate(auto):
        right.bar([i], [r["gpu_hours"]], **bar_style(i))
    right.set_xticks(range(len(auto)), [r["autoscaler"] for r in auto])
    right.set_ylabel("GPU-hours")
    right.set_title("GPUs held over the run")
    right.grid(alpha=0.3, axis="y")
    handles, names = left.get_legend_handles_labels()
    legend_outside(right, handles=handles, labels=names, title="autoscaler")
    fig.tight_layout()
    return fig


def write_plots(rows: Sequence[Mapping[str, Any]], out: Any) -> None:
    auto = [r for r in rows if "autoscaler" in r]
    if not auto:
        return
    plt = pyplot()
    for name, build in (("autoscaling_replicas.png", replicas_figure), ("autoscaling_summary.png", summary_figure)):
        fig = build(auto)
        fig.savefig(out / name, dpi=110, bbox_inches="tight")
        plt.close(fig)
