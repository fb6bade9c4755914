"""`python -m topology` (also `isle topology`): parse, show, diff, discover, survey, bench.

Exit codes: 0 success; 1 `diff` found something worse; 2 bad input or discovery failure
(one line on stderr, never a traceback).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from topology.errors import TopologyError
from topology.export import dumps, topology_capture
from topology.model import Topology
from topology.readers import ReadOptions, read_source
from topology.readers.nccl import normalise_busid as _norm_busid


def _pci_classes(values: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values:
        busid, sep, role = item.partition("=")
        if not sep or role not in ("gpu", "nic", "bridge"):
            raise TopologyError(f"--pci-class wants BUSID=gpu|nic|bridge, got {item!r}")
        key = busid.strip().lower()
        out[key if key == "*" else _norm_busid(key)] = role
    return out


def _options(args: argparse.Namespace) -> ReadOptions:
    return ReadOptions(
        node_name=args.node,
        gpu=args.gpu,
        pci_classes=_pci_classes(args.pci_class or []),
    )


def _read(source: str, args: argparse.Namespace) -> Topology:
    topology = read_source(source, _options(args))
    for node in topology.nodes:
        for note in node.notes:
            print(f"warning: {source}: {note}", file=sys.stderr)
    return topology


def _add_read_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--node", default="node0", help="node name for single-machine captures")
    p.add_argument("--gpu", help="GPU model when the source does not name it (e.g. h100-sxm)")
    p.add_argument("--pci-class", action="append", metavar="BUSID=ROLE",
                   help="classify an NCCL XML entry that has no class (gpu, nic or bridge); "
                   "BUSID '*' names every other unclassified entry")


def cmd_parse(args: argparse.Namespace) -> int:
    topology = _read(args.file, args)
    if args.format == "json":
        sys.stdout.write(dumps(topology_capture(topology)))
    elif args.format == "model":
        from topology.serialize import dumps as dump_model

        sys.stdout.write(dump_model(topology))
    else:
        from topology.summary import describe

        sys.stdout.write(describe(topology))
    return 0


def _plan_overlay(source: str) -> dict[str, object]:
    """A placement-plan JSON (`python -m pools plan --format json`), checked before drawing."""
    try:
        plan = json.loads(Path(source).read_text())
    except OSError as err:
        raise TopologyError(f"{source}: cannot read plan: {err.strerror}") from None
    except ValueError:
        raise TopologyError(f"{source}: the plan is not JSON") from None
    placements = plan.get("placements") if isinstance(plan, dict) else None
    ok = isinstance(placements, list) and all(
        isinstance(p, dict) and isinstance(p.get("node"), str) and isinstance(p.get("gpus"), list)
        and all(isinstance(g, int) and not isinstance(g, bool) for g in p["gpus"]) for p in placements)
    if not ok:
        raise TopologyError(f"{source}: a plan is an object whose `placements` list has node and gpus (integers)")
    paths = plan.get("kv_paths", [])
    if not isinstance(paths, list) or not all(isinstance(k, dict) and isinstance(k.get("prefill"), str)
                                              and isinstance(k.get("decode"), str) for k in paths):
        raise TopologyError(f"{source}: `kv_paths` is a list of objects with prefill and decode replica ids (and "
                            "a verdict), as `isle status --format json` gives them under replicas.kv_paths.pairs")
    return plan  # type: ignore[no-any-return]


def cmd_show(args: argparse.Namespace) -> int:
    from topology.draw import draw

    topology = _read(args.source, args)
    overlay = _plan_overlay(args.plan) if args.plan else None
    draw(topology, Path(args.out), plan=overlay, title=args.title or Path(args.source).name)
    print(args.out)
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    from topology.bench.record import is_record
    from topology.diff import diff, render

    if is_record(args.old) and is_record(args.new):  # two `bench` records: measured bandwidth
        from topology.bench.record import load, regressions

        changes = regressions(load(args.old), load(args.new))
    else:
        changes = diff(_read(args.old, args), _read(args.new, args))
    if args.format == "json":
        print(json.dumps([c.as_json() for c in changes], indent=2))
    else:
        sys.stdout.write(render(changes))
    return 1 if any(c.worse for c in changes) else 0


def cmd_discover(args: argparse.Namespace) -> int:
    from topology.readers.nvml import discover

    node = discover(node_name=args.node, sample_s=args.health_interval)
    topology = Topology(nodes=(node,))
    if args.format == "json":
        sys.stdout.write(dumps(topology_capture(topology)))
    else:
        from topology.serialize import dumps as dump_model

        sys.stdout.write(dump_model(topology))
    return 0


def cmd_survey(args: argparse.Namespace) -> int:
    from topology.survey import survey

    return survey([Path(s) for s in args.sources], Path(args.out_dir), _options(args))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m topology", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("parse", help="read a capture, NCCL XML, cluster spec or template")
    p.add_argument("file")
    p.add_argument("--format", choices=["json", "text", "model"], default="text")
    _add_read_options(p)
    p.set_defaults(func=cmd_parse)

    p = sub.add_parser("show", help="draw the topology as SVG or PNG")
    p.add_argument("source")
    p.add_argument("--out", required=True, help="FILE.svg or FILE.png")
    p.add_argument("--plan", help="placement plan JSON to overlay (`python -m pools plan --format json`); its "
                   "optional `kv_paths` list draws each prefill->decode pair coloured by its KV-path verdict")
    p.add_argument("--title")
    _add_read_options(p)
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("diff", help="what got worse or better between two topologies, or two bench records "
                                    "(exit 1: worse)")
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--format", choices=["json", "text"], default="text")
    _add_read_options(p)
    p.set_defaults(func=cmd_diff)

    p = sub.add_parser("discover", help="live discovery through NVML on this machine")
    p.add_argument("--format", choices=["json", "model"], default="json")
    p.add_argument("--node", default="node0")
    p.add_argument("--health-interval", type=float, default=0.0,
                   help="seconds between two counter samples for error rates (0: no rates)")
    p.set_defaults(func=cmd_discover)

    p = sub.add_parser("survey", help="parse and draw many sources; print their islands")
    p.add_argument("sources", nargs="+")
    p.add_argument("--out-dir", default="out/topology")
    _add_read_options(p)
    p.set_defaults(func=cmd_survey)

    from topology.bench.cli import add_bench_parser

    add_bench_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except TopologyError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except ValueError as err:  # bad hint values, unknown GPU models
        print(f"error: {err}", file=sys.stderr)
        return 2
