"""`python -m pools sim-engine ...`: build a simulated engine from the command line and serve it."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import uuid
from pathlib import Path

from pools import catalog
from pools.costmodel import LinkCost
from pools.engine.core import EngineConfig
from pools.engine.pd import Placement, is_loopback
from pools.engine.server import EngineIdentity, SimEngine
from pools.engine.toolcall import ToolSetup
from pools.wire.lifecycle import follow_parent, serve_until_signalled
from topology import GpuRef, LinkKind, bottleneck, read_source
from topology.gpus import gpu_facts
from topology.kinds import default_bandwidth_gb_s, default_latency_us

TP_LINKS = ("nvlink", "pix", "pxb", "phb", "node", "sys", "rdma", "tcp")


def link_of_kind(kind_name: str, gpu: str) -> LinkCost:
    kind = LinkKind.parse(kind_name)
    facts = gpu_facts(gpu)
    if kind is LinkKind.NVLINK and facts.fabric == "nvswitch":
        kind = LinkKind.NVSWITCH
    lanes = facts.nvlink_lanes if kind in (LinkKind.NVLINK, LinkKind.NVSWITCH) else None
    gen, pcie = facts.nvlink_generation, facts.pcie_generation
    return LinkCost(bandwidth_gb_s=default_bandwidth_gb_s(kind, lanes, gen, pcie), latency_us=default_latency_us(kind))


def _placement(text: str) -> Placement:
    raw = Path(text).read_text() if not text.lstrip().startswith("{") else text
    data = json.loads(raw)
    return Placement(node=str(data["node"]), gpus=tuple(int(g) for g in data["gpus"]))


def build(args: argparse.Namespace) -> SimEngine:
    if not args.time_scale > 0 or args.time_scale != args.time_scale:
        raise ValueError("--time-scale must be a positive number")
    if not is_loopback(args.host):
        raise ValueError(f"--host {args.host}: the simulated engine listens on loopback addresses only")
    model, gpu = catalog.model(args.model), catalog.gpu(args.gpu)
    link = link_of_kind(args.tp_link, args.gpu)
    topology, placement = None, None
    if args.placement:
        if not args.topology:
            raise ValueError("--placement needs --topology")
        topology = read_source(args.topology)
        placement = _placement(args.placement)
        if len(placement.gpus) != args.tp:
            raise ValueError(f"--placement has {len(placement.gpus)} GPUs for --tp {args.tp}")
        if args.tp > 1:
            link = LinkCost.of(bottleneck(topology, [GpuRef(placement.node, g) for g in placement.gpus]))
    config = EngineConfig(model=model, gpu=gpu, tp=args.tp, link=link, max_num_seqs=args.max_num_seqs,
                          max_num_batched_tokens=args.max_num_batched_tokens,
                          kv_capacity_tokens=args.kv_capacity_tokens)
    if config.capacity() < config.block_size:
        raise ValueError(f"{args.model} at tp={args.tp} leaves no room for KV cache on {args.gpu}")
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        raise ValueError("--enable-auto-tool-choice requires --tool-call-parser")  # as vLLM's cli_args.py
    identity = EngineIdentity(served_model=args.served_model_name or args.model,
                              engine_id=args.engine_id or uuid.uuid4().hex[:8], role=args.role, host=args.host,
                              port=args.port, placement=placement, topology=topology, kv_hold_s=args.kv_hold_s,
                              tools=ToolSetup(args.tool_call_parser, args.enable_auto_tool_choice))
    return SimEngine(config, identity, time_scale=args.time_scale)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="catalogue model, also the served model id")
    p.add_argument("--gpu", required=True, help="catalogue GPU (h100-sxm, a100-sxm4, ...)")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--tp-link", default="nvlink", choices=TP_LINKS, help="the TP group's bottleneck link kind")
    p.add_argument("--port", type=int, default=0, help="0: any free port")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--time-scale", type=float, default=1.0, help="wall seconds per modelled second")
    p.add_argument("--topology", help="topology source, for the real TP link and KV paths")
    p.add_argument("--placement", help='{"node": ..., "gpus": [...]} or a file with it')
    p.add_argument("--role", default="mixed", choices=["prefill", "decode", "mixed"])
    p.add_argument("--engine-id")
    p.add_argument("--served-model-name")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--kv-capacity-tokens", type=int, help="override the cache size the cost model gives")
    p.add_argument("--kv-hold-s", type=float, default=60.0, help="how long a prefill keeps KV for its decode")
    p.add_argument("--tool-call-parser", help="vLLM's: tool_choice 'required' and named functions need it (any name: "
                   "the simulated model writes one format)")
    p.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="vLLM's: tool_choice 'auto' (needs --tool-call-parser)")
    p.add_argument("--log-level", default="warning")


def die_with_parent() -> None:
    """Started by a replica actor (ISLE_PARENT_PID): exit when it dies (Linux PR_SET_PDEATHSIG)."""
    parent = os.environ.get("ISLE_PARENT_PID")
    if not parent:
        return
    follow_parent(signal.SIGTERM)
    if str(os.getppid()) != parent:
        sys.exit(1)  # the parent died before we asked to follow it


def main(args: argparse.Namespace) -> int:
    die_with_parent()
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    engine = build(args)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    desc = f"(model {engine.id.served_model}, {args.gpu} tp={args.tp} {args.tp_link}, role {args.role})"
    asyncio.run(serve_until_signalled(engine.start, engine.stop,
                                      lambda: f"isleserve sim-engine {desc} ready: {engine.url}/v1"))
    return 0
