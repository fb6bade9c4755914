"""`python -m loadtest chaos --out DIR`: the local simulated deployment under faults, at 80 % of its
capacity, every request accounted for.

    python -m loadtest chaos --out out/chaos [--spec configs/chaos.yaml] [--scale K]
        [--capacity-rps R] [--load F] [--no-faults SECONDS | --reference DIR]

It deploys `configs/local.yaml` on a Ray head of its own with one Ray node per simulated node
(`loadtest.chaos.cluster`), finds the deployment's capacity with the simulator on the deployed
plan (`loadtest.chaos.capacity`; `--capacity-rps` gives it instead), drives it open loop at
`load` x capacity (`loadtest.chaos.driver`) and, after a quiet window, does each fault of the spec
in turn, waiting for recovery and a quiet window after each (`loadtest.chaos.faults`): a replica's
engine killed mid-stream, a TP group's NVLink degraded then marked unhealthy, a Ray node lost, a
3x burst; or (`configs/chaos-kv.yaml`, `loadtest.chaos.kvfaults`) one PD pair's KV at TCP speed
or through a remote NIC, until the router flags and avoids the pair. Then it stops sending, waits
for every request (each has a deadline), tears everything down (also on an error, Ctrl-C or
SIGTERM) and writes:

    DIR/chaos.json      sent, completed, errored (by cause), lost, hung, duplicated_tokens; per
                        fault its times (drain, re-place; a KV fault's flag and avoidance and the
                        pair's share of PD requests), interactive attainment and TTFT before,
                        during and after; shedding; router RSS over time; the checks and `passed`
    DIR/requests.jsonl  every request: class, times, status, replica, tokens, verdict
    DIR/events.jsonl    the controller's record of the run

Exit status 0 when every check passed, 1 otherwise (or when the deployment did not come up).
`--scale K` multiplies the quiet windows and fault durations (a shorter run for tests).
`--no-faults SECONDS` drives the same load with no fault (a reference run); `--reference DIR`
compares each KV fault's after window with the same window of such a run (`loadtest.chaos.kvreport`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from isleserve.settings import AppArgs
from loadtest.chaos import capacity as chaoscapacity
from loadtest.chaos.checks import checks, crash_details, node_loss_details, overload_details
from loadtest.chaos.cluster import ChaosCluster, chaos_args, chaos_deployment
from loadtest.chaos.driver import ChaosDriver, ChaosRecord
from loadtest.chaos.faults import ACTIONS, FaultContext, Observer, inflict, wall_offset
from loadtest.chaos.kvfaults import ACTIONS as KV_ACTIONS
from loadtest.chaos.kvreport import KV_KINDS, kv_details, kv_progress, kv_summary, recorded
from loadtest.chaos.load import RequestFactory
from loadtest.chaos.report import Verdict, classified, fault_windows, memory, shedding, totals, window
from loadtest.chaos.spec import ChaosSpec, kv_pair_problems, load_chaos_spec
from loadtest.live.client import Target, loopback_target
from loadtest.live.deploy import ROOT, DeployError
from loadtest.live.run import pick_model
from pools.model import SLOClass
from router.config import DEV_ADMIN_KEY, DEV_KEY
from topology.configfile import format_validation
from topology.errors import ParseError

DEFAULT_SPEC = ROOT / "configs" / "chaos.yaml"
Reference = list[tuple[ChaosRecord, Verdict]] | None
"""A no-fault run's requests (`--reference`)."""


@dataclasses.dataclass(slots=True)
class Run:
    records: list[ChaosRecord]
    faults: list[dict[str, Any]]
    observer: Observer
    load_end_s: float
    max_lag_ms: float


async def drive(spec: ChaosSpec, cluster: ChaosCluster, factory: RequestFactory, rate_wall_rps: float,
                say: Callable[[str], None], hold_s: float = 0.0) -> Run:
    """The timeline; `hold_s`: the load goes on that long after the faults (a no-fault run's length)."""
    host, port = loopback_target(cluster.router_url)
    target = Target(host, port)
    model = await pick_model(target, DEV_KEY)
    driver = ChaosDriver(target, factory, model, DEV_KEY, rate_wall_rps, spec.request_deadline_s,
                         seed=spec.workload.seed)
    observer = Observer(admin=Target(host, port), admin_key=DEV_ADMIN_KEY, now=driver.now,
                        router_port=cluster.router_port, in_flight=driver.in_flight)
    watching = asyncio.create_task(observer.run())
    load = asyncio.create_task(driver.run())
    ctx = FaultContext(spec=spec, cluster=cluster, driver=driver, observer=observer,
                       wall_offset=wall_offset(driver.now))
    faults: list[dict[str, Any]] = []
    try:
        await asyncio.wait_for(observer.seen.wait(), 30)
        say(f"load: {rate_wall_rps:.2f} req/s (wall); warm-up {spec.warmup_s:g} s, then quiet for {spec.window_s:g} s")
        await asyncio.sleep(spec.warmup_s + spec.window_s)
        for f in spec.faults:
            say(f"fault: {f.kind} at {driver.now():.0f} s ({driver.in_flight()} requests in flight)")
            record = await inflict(f, ctx, {**ACTIONS, **KV_ACTIONS})
            faults.append(record)
            said = record.get("error") or (kv_progress(record) if f.kind in KV_KINDS else
                                           f"recovered at {record['recovered_s']:.0f} s"
                                           if record.get("recovered_s") is not None else "NOT recovered")
            say(f"fault: {f.kind}: {said}; quiet for {spec.window_s:g} s")
            await asyncio.sleep(spec.window_s)
        await asyncio.sleep(hold_s)
    finally:
        await ctx.lift_all()  # faults that last until the end of the run
        driver.stop()
        load_end = driver.now()
        say(f"stopped sending at {load_end:.0f} s; waiting for {driver.in_flight()} requests in flight")
        records = await load
        observer.stopping.set()
        await watching
        await target.aclose()
    return Run(records=records, faults=faults, observer=observer, load_end_s=load_end,
               max_lag_ms=round(driver.max_lag_s * 1000, 1))


def _fault_entry(f: dict[str, Any], pairs: Any, spec: ChaosSpec, classes: dict[str, SLOClass],
                 table_changes: list[dict[str, Any]], baseline: tuple[float, float], reference: Reference
                 ) -> dict[str, Any]:
    entry = dict(f)
    if f["kind"] in KV_KINDS:  # its own windows: the run's no-fault window, during, after the pair is avoided
        entry["details"] = {} if "error" in f else kv_details(pairs, f, baseline, spec.window_s, classes,
                                                               spec.time_scale, reference)
        return entry
    at, back = f["at_s"], f.get("recovered_s")
    entry["time_to_recover_s"] = None if back is None else round(back - at, 2)
    if f["kind"] == "link_degrade" and f.get("controller_marked_s") is not None:
        marked = f["controller_marked_s"]  # the controller took the link out of service
        entry["time_to_mark_s"] = _since(marked, at)  # the health check's delay and the mark-link command
        entry["time_to_stop_routing_s"] = _since(f.get("table_draining_s"), marked)  # router's table: draining
        entry["time_to_replace_s"] = _since(back, marked)  # the replacement serves in the router's table
        entry["time_to_drain_s"] = _since(f.get("drained_s"), marked)  # the old replica stopped
    if f["kind"] == "node_loss":
        entry["time_to_detect_s"] = _since(f.get("detected_s"), at)
        entry["time_to_replace_s"] = _since(back, at)
    ts = spec.time_scale
    entry["interactive"] = fault_windows(pairs, f, spec.window_s, classes, ts) if "error" not in f else {}
    if f["kind"] == "replica_crash":
        entry["details"] = crash_details(pairs, f, spec.window_s)
    elif f["kind"] == "node_loss":
        entry["details"] = node_loss_details(pairs, f, table_changes)
    elif f["kind"] == "overload":
        entry["details"] = overload_details(pairs, f, classes, ts)
    return entry


def _since(t: float | None, t0: float) -> float | None:
    return None if t is None else round(t - t0, 2)


def build_report(spec: ChaosSpec, run: Run, cluster: ChaosCluster, capacity: chaoscapacity.Capacity,
                 capacity_source: str, command: str, deploy_s: float, reference: Reference = None) -> dict[str, Any]:
    classes = cluster.args.router.classes()
    pairs = classified(run.records)
    rate = spec.load * capacity.rps
    first = float(run.faults[0]["at_s"]) if run.faults else run.load_end_s
    baseline = (max(0.0, first - spec.window_s), first)  # the quiet window before any fault: the no-fault run
    report: dict[str, Any] = {
        "command": command,
        "load": {"capacity_rps": capacity.rps, "capacity_from": capacity_source, "capacity_probes": capacity.probes,
                 "load": spec.load, "rate_rps": round(rate, 2), "rate_wall_rps": round(rate / spec.time_scale, 3),
                 "time_scale": spec.time_scale, "duration_s": round(run.load_end_s, 1),
                 "max_send_lag_ms": run.max_lag_ms, "workload": spec.workload.model_dump()},
        **totals(pairs),
        "by_class": {name: window(pairs, 0.0, None, name, classes, spec.time_scale) for name in sorted(classes)},
        "faults": [_fault_entry(f, pairs, spec, classes, run.observer.changes, baseline, reference)
                   for f in run.faults],
        "shedding": shedding(pairs, classes),
        "router_memory": memory(run.observer.rss, run.load_end_s),
        "routing_table_changes": run.observer.changes,
        "kv_path_changes": run.observer.kv_changes,
        "deployment": {"serve_config": cluster.serve_config.name, "deploy_s": round(deploy_s, 1),
                       "head_node": spec.head_node, "ray_nodes": list(spec.ray_nodes),
                       "sessions": [cluster.head.proc.pid, *(p.pid for p in cluster.nodes.values())],
                       "ray_temp_dir": str(cluster.head.temp_dir), "router": cluster.router_url,
                       "drain_timeout_s": cluster.args.drain_timeout_s},
        "spec": spec.model_dump(mode="json"),
    }
    report["checks"] = checks(report, classes)
    report["passed"] = all(report["checks"].values())
    return report


def write_outputs(out: Path, report: dict[str, Any], run: Run, cluster: ChaosCluster) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "chaos.json").write_text(json.dumps(report, indent=2) + "\n")
    with (out / "requests.jsonl").open("w") as f:
        for r, v in classified(run.records):
            row = {k: v2 for k, v2 in dataclasses.asdict(r).items() if k != "words"}
            f.write(json.dumps({**row, "tokens": v.tokens, "verdict": v.bucket, "cause": v.cause,
                                "duplicated": v.duplicated}) + "\n")
    events = cluster.state_dir / "events.jsonl"
    if events.exists():
        shutil.copy(events, out / "events.jsonl")
    shutil.copy(cluster.serve_config, out / cluster.serve_config.name)


def summary_lines(report: dict[str, Any]) -> list[str]:
    lines = [f"sent {report['sent']}, completed {report['completed']}, errored {report['errored']} "
             f"{report['errored_by_cause']}, lost {report['lost']}, hung {report['hung']}, duplicated tokens "
             f"{report['duplicated_tokens']}"]
    for f in report["faults"]:
        if f["kind"] in KV_KINDS:
            lines.append(kv_summary(f))
            continue
        w = f.get("interactive", {})
        att = " / ".join("-" if w.get(k, {}).get("slo_attainment") is None else f"{w[k]['slo_attainment']:.0%}"
                         for k in ("before", "during", "after"))
        lines.append(f"{f['kind']}: recovered in {f.get('time_to_recover_s')} s; interactive attainment "
                     f"before/during/after {att}" + (f"; error: {f['error']}" if f.get("error") else ""))
    lines += [f"check {name}: {'ok' if ok else 'FAILED'}" for name, ok in report["checks"].items()]
    return lines


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtest chaos", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for chaos.json, requests.jsonl and events.jsonl")
    p.add_argument("--spec", default=str(DEFAULT_SPEC), help="the chaos spec (default: configs/chaos.yaml)")
    p.add_argument("--scale", type=float, help="multiply quiet windows and fault durations (e.g. 0.5)")
    p.add_argument("--capacity-rps", type=float, help="the deployment's capacity in modelled req/s (skips the "
                   "simulator's estimate)")
    p.add_argument("--load", type=float, help="offered load as a fraction of capacity (default: the spec's)")
    p.add_argument("--no-faults", type=float, metavar="SECONDS", help="do no fault: the load runs the warm-up, the "
                   "quiet window and SECONDS more (a reference run for --reference)")
    p.add_argument("--reference", metavar="DIR", help="a --no-faults run of the same spec and seed: each KV fault's "
                   "after window is compared with the same window there")
    return p


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(argv)
    try:
        spec, base = load_chaos_spec(args.spec)
        if args.scale is not None:
            if args.scale <= 0:
                raise ValueError("--scale must be positive")
            spec = spec.scaled(args.scale)
        updates = {k: v for k, v in (("capacity_rps", args.capacity_rps), ("load", args.load)) if v is not None}
        spec = ChaosSpec.model_validate({**spec.model_dump(), **updates})
    except ValidationError as err:
        print(f"loadtest chaos: {format_validation(err)}", file=sys.stderr)
        return 2
    except (ParseError, ValueError) as err:
        print(f"loadtest chaos: {err}", file=sys.stderr)
        return 2

    def say(line: str) -> None:
        print(f"chaos: {line}", file=sys.stderr, flush=True)

    command = "python -m loadtest chaos " + " ".join(argv)
    if args.no_faults is not None:
        spec = spec.model_copy(update={"faults": []})
    try:
        reference = None if args.reference is None else recorded(
            json.loads(line) for line in (Path(args.reference) / "requests.jsonl").read_text().splitlines())
    except (OSError, ValueError, KeyError, TypeError) as err:
        print(f"loadtest chaos: --reference {args.reference}: {err}", file=sys.stderr)
        return 2
    factory = RequestFactory(spec.workload)
    problems = kv_pair_problems(spec.faults, _roles(chaos_args(spec, base, Path("state"))[2]))
    if problems:
        print("loadtest chaos: " + "; ".join(problems), file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="isle-chaos-") as tmp:
        work = Path(tmp)
        _, _, app_args = chaos_args(spec, base, work / "state")
        if spec.capacity_rps is not None:
            capacity, source = chaoscapacity.Capacity(rps=spec.capacity_rps, probes=()), "spec"
        else:
            capacity, source = chaoscapacity.estimate(app_args, factory), "simulator"
        say(f"capacity {capacity.rps:g} req/s modelled ({source}); load {spec.load:g} of it at time scale "
            f"{spec.time_scale:g}")
        started = time.monotonic()
        try:
            with chaos_deployment(spec, base, work, say) as cluster:
                deploy_s = time.monotonic() - started
                run = _run(drive(spec, cluster, factory, spec.load * capacity.rps / spec.time_scale, say,
                                 args.no_faults or 0.0))
                say("tearing down")
            report = build_report(spec, run, cluster, capacity, source, command, deploy_s, reference)
            write_outputs(Path(args.out), report, run, cluster)
        except DeployError as err:
            say(f"the deployment did not come up: {err}")
            return 1
    for line in summary_lines(report):
        say(line)
    return 0 if report["passed"] else 1


def _roles(args: AppArgs) -> dict[str, str]:
    """Replica id -> role, as the controller names the replicas it starts with."""
    return {f"{p.name}-{i}": p.role for p in args.pools
            for i in range(p.replicas if isinstance(p.replicas, int) else 0)}


def _run(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)
