"""`isle status`: what a running deployment is doing, read from its router's admin API — nodes
and their NVLink islands, pools, replicas with their GPUs and health, the plan's policy and the
routing table's version.

    isle status [--url http://127.0.0.1:8000] [--admin-key KEY] [--format text|json] [--draw FILE.svg]

--draw also draws the deployment: its topology, the plan's replicas outlined by role, and each
prefill->decode pair's KV path coloured by the router's verdict (dashed while avoided).

The admin key comes from --admin-key, else $ISLE_ADMIN_KEY, else the development admin key of
the local configs (`isle-dev-admin`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from router.config import DEV_ADMIN_KEY
from topology.islands import islands
from topology.serialize import from_dict
from wire.client import Client, ClientError, RefusedUrl, StatusError


def collect(base: str, key: str) -> dict[str, Any]:
    """The deployment's state as one JSON document (topology and plan are optional on a router).
    `base` may be another host's: an operator asks the router where it runs."""
    with Client(base, key=key, timeout_s=10, remote_ok=True) as admin:
        state: dict[str, Any] = {"url": base, "replicas": admin.get_json("/admin/replicas")}
        for name in ("plan", "topology"):
            try:
                state[name] = admin.get_json(f"/admin/{name}")
            except StatusError as err:
                if err.status != 404:
                    raise
                state[name] = None
    return state


def render(state: dict[str, Any]) -> str:
    """A person's view of `collect`'s document."""
    lines = []
    plan, table = state["plan"], state["replicas"]
    policy = plan["policy"] if plan else "-"
    fingerprint = plan["topology_fingerprint"][:12] if plan else "-"
    lines.append(f"deployment {state['url']}: routing table v{table['version']}, policy {policy}, "
                 f"topology {fingerprint}")
    if state["topology"] is not None:
        topology = from_dict(state["topology"])
        lines.append("nodes:")
        by_node: dict[str, list[str]] = {}
        for island in islands(topology):
            kind = island.kind.name.lower() if island.kind is not None else "single"
            gpus = ",".join(str(ref.index) for ref in island.gpus)
            by_node.setdefault(island.gpus[0].node, []).append(f"{island.id.split('/')[-1]}[{gpus}] {kind}")
        for node in topology.nodes:
            unhealthy = sum(1 for link in node.links if not link.health.healthy)
            health = f", {unhealthy} unhealthy link(s)" if unhealthy else ""
            lines.append(f"  {node.name} ({node.machine or '?'}, {len(node.gpus)} GPUs{health}): "
                         + "  ".join(by_node.get(node.name, [])))
    if plan is not None:
        pools = Counter(p["pool"] for p in plan["placements"])
        unplaced = f", {len(plan['unplaced'])} unplaced" if plan["unplaced"] else ""
        lines.append("pools: " + ", ".join(f"{name} x{count}" for name, count in pools.items()) + unplaced)
        for p in plan["placements"]:
            if p.get("members"):
                domains = "one NVLink domain" if p.get("in_domain") else f"across {p['island'].count('+') + 1} domains"
                line = f"  gang {p['replica_id']}: {len(p['members'])} rank groups, {domains} ({p['tier']})"
                if p.get("experts"):
                    e = p["experts"]
                    line += (f"; experts {e['policy']} (+{e['redundant']} redundant): balancedness "
                             f"{e['balancedness']:.2f}, {e['cross_domain_share']:.0%} of pairs cross domains")
                lines.append(line)
    lines.extend(_controller_lines(plan.get("controller") if plan else None))
    lines.append("replicas:")
    for r in table["replicas"]:
        health = "healthy" if r["healthy"] and not r["breaker_open"] else "UNHEALTHY"
        if r["draining"]:
            health += ", draining"
        gpus = ",".join(str(g) for g in r["gpus"])
        lines.append(f"  {r['replica_id']:<14} {r['pool']:<10} {r['role']:<8} {r['node']}:[{gpus}] {r['tier']:<8} "
                     f"{health}; running {r['running']:g}, waiting {r['waiting']:g}, in flight {r['inflight']}, "
                     f"kv {r['kv_usage']:.0%}{_cache(r.get('prefix_cache'))}")
    lines.extend(_kv_path_lines(table.get("kv_paths")))
    return "\n".join(lines) + "\n"


def overlay(state: dict[str, Any]) -> dict[str, Any] | None:
    """The plan the drawing outlines, with the router's KV-path verdicts as its `kv_paths`."""
    if state["plan"] is None:
        return None
    pairs = (state["replicas"].get("kv_paths") or {}).get("pairs") or []
    return {**state["plan"], "kv_paths": [{k: p.get(k) for k in ("prefill", "decode", "verdict", "avoided")}
                                          for p in pairs]}


def draw_state(state: dict[str, Any], out: str) -> str | None:
    """Draw the deployment to `out`; why not, when it cannot be drawn."""
    from topology.draw import draw
    from topology.errors import TopologyError

    if state["topology"] is None:
        return "the router has no topology to draw (/admin/topology answered 404)"
    try:
        draw(from_dict(state["topology"]), Path(out), plan=overlay(state), title=f"isle status {state['url']}")
    except (TopologyError, OSError) as err:
        return str(err)
    return None


def _kv_path_lines(view: dict[str, Any] | None) -> list[str]:
    """Each PD pair's KV-path verdict as the router judges it (router `pd.kv_path`)."""
    if not view or not view.get("pairs"):
        return []
    lines = ["kv paths (prefill->decode):"]
    for p in view["pairs"]:
        measured = f"{p['measured_gb_s']:g}" if p.get("measured_gb_s") is not None else "-"
        expected = f"{p['expected_gb_s']:g}" if p.get("expected_gb_s") is not None else "-"
        avoided = ", AVOIDED" if p.get("avoided") else ""
        lines.append(f"  {p['pair']:<24} {p['tier']:<8} {p['verdict']}{avoided}; {measured} of {expected} GB/s "
                     f"({p['bandwidth_ratio']:.0%}), {p['samples']} samples")
    return lines


def _cache(view: dict[str, Any] | None) -> str:
    """A replica's prefix cache as the router's KV index sees it (router `kv_events`)."""
    if not view:
        return ""
    ratio = f"{view['hit_ratio']:.0%}" if view.get("hit_ratio") is not None else "-"
    return f", cache {view['blocks']} blocks, hits {ratio}"


def _controller_lines(view: dict[str, Any] | None) -> list[str]:
    """The controller's own view: Ray nodes missing their labels, marked links, lost nodes, moves."""
    if not view:
        return []
    lines = []
    problems = view.get("node_check", {}).get("problems", {})
    if problems:
        lines.append("node check (Ray labels and resources, see `python -m pools node-labels`):")
        lines.extend(f"  {node}: {'; '.join(why)}" for node, why in sorted(problems.items()))
    for what, key in (("marked links", "marked_links"), ("lost nodes", "lost_nodes"), ("draining", "draining")):
        if view.get(key):
            lines.append(f"{what}: " + ", ".join(":".join(map(str, x)) if isinstance(x, list) else str(x)
                                                for x in view[key]))
    starting = view.get("starting")
    if isinstance(starting, dict) and starting:  # replica -> why (restart, move, resume)
        lines.append("starting: " + ", ".join(f"{rid} ({why})" for rid, why in sorted(starting.items())))
    return lines + _transport_lines(view.get("transport_env")) + _kv_action_lines(view.get("kv_paths")) \
        + _autoscaling_lines(view.get("autoscaling"))


def _transport_lines(env: dict[str, Any] | None) -> list[str]:
    """Engines whose transport variables differ from what their plan implies (checked at start)."""
    if not env:
        return []
    lines = ["transport variables not as planned (checked at each engine's start):"]
    for rid, found in sorted(env.items()):
        for m in found:
            rank = f" rank {m['rank']}" if m.get("rank") is not None else ""
            actual = "unset" if m.get("actual") is None else f"{m['variable']}={m['actual']}"
            lines.append(f"  {rid}{rank}: {actual}, plan {m.get('planned') or '-'}: {m['why']}")
    return lines


def _kv_action_lines(view: dict[str, Any] | None) -> list[str]:
    """The controller's side of the KV-path verdicts: its policy, the pairs not as planned and
    what waits (`kv_path_action`)."""
    if not view or (view.get("action") == "none" and not view.get("not_as_planned")):
        return []
    bad = ", ".join(f"{pair} {verdict}" for pair, verdict in sorted(view.get("not_as_planned", {}).items()))
    action = view.get("action")
    when = f" after {view['after_s']:g} s" if action != "none" else ""
    lines = [f"kv_path_action: {action}{when}" + (f"; not as planned: {bad}" if bad else "")]
    lines.extend(f"  waiting: {w}" for w in view.get("waiting", []))
    if view.get("cooling_down"):
        lines.append("  cooling down: " + ", ".join(view["cooling_down"]))
    return lines


def _autoscaling_lines(auto: dict[str, Any] | None) -> list[str]:
    """Each autoscaled pool's counts and what the autoscaler saw, then its last decisions."""
    if not auto:
        return []
    lines = [f"autoscaling (a decision every {auto.get('interval_s', 0):g} s):"]
    for name, p in sorted(auto.get("pools", {}).items()):
        capacity = f"; one replica carries {p['capacity_rps']:g} req/s" if p.get("capacity_rps") else ""
        lines.append(f"  {name}: {p['placed']} placed, {p['serving']} serving, wanted {p['wanted']} "
                     f"(min {p['min']}, max {p['max']}); {p['request_rate']:g} req/s sent, {p['in_flight']:g} in "
                     f"flight{capacity}; scaled out {p['scaled_out']}, in {p['scaled_in']} times")
    for d in auto.get("decisions", [])[-5:]:
        where = ", ".join(f"{x['replica_id']} on {x['node']}:{x['gpus']} ({x['tier']})" for x in d.get("placed", []))
        gone = ", ".join(d.get("removed", []))
        lines.append(f"  {d['ago_s']:g} s ago, {d['pool']}: {d['reason']}"
                     + (f" -> started {where}" if where else "") + (f" -> draining {gone}" if gone else "")
                     + (f" ({d['missing']} found no free GPUs)" if d.get("missing") else ""))
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="isle status", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the router's base URL")
    parser.add_argument("--admin-key", default=None, help="admin API key (default: $ISLE_ADMIN_KEY, else the dev key)")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--draw", metavar="FILE", help="also draw the deployment (.svg or .png): topology, "
                        "replicas by role, each PD pair's KV path coloured by its verdict")
    args = parser.parse_args(argv)
    key = args.admin_key or os.environ.get("ISLE_ADMIN_KEY") or DEV_ADMIN_KEY
    base = args.url.rstrip("/")
    try:
        state = collect(base, key)
    except RefusedUrl as err:
        print(f"isle status: --url {err}", file=sys.stderr)
        return 2
    except StatusError as err:
        hint = " (check --admin-key or $ISLE_ADMIN_KEY)" if err.status in (401, 403) else ""
        print(f"isle status: {base} answered HTTP {err.status}{hint}", file=sys.stderr)
        return 1
    except ClientError as err:
        print(f"isle status: cannot reach the router at {base} ({err}); is the product running?",
              file=sys.stderr)
        return 1
    sys.stdout.write(json.dumps(state, indent=2) + "\n" if args.format == "json" else render(state))
    if args.draw:
        why = draw_state(state, args.draw)
        if why is not None:
            print(f"isle status: --draw {args.draw}: {why}", file=sys.stderr)
            return 1
        print(f"isle status: drawn to {args.draw}", file=sys.stderr)
    return 0
