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
from typing import Any

from physics import catalog
from physics.costmodel import LOCAL, LinkCost
from physics.gang import GangCost
from pools.ganglinks import boundary_links, gang_links
from pools.model import GangMember, ReplicaPlacement
from simengine.core import EngineConfig
from simengine.kvread import POLICIES
from simengine.lora import MAX_LORA_RANKS, LoraModule, LoraSpec, parse_module, runtime_updating
from simengine.pd import Placement, is_loopback
from simengine.server import EngineIdentity, SimEngine
from simengine.toolcall import ToolSetup
from topology import GpuRef, LinkKind, Topology, bottleneck, read_source
from topology.gpus import gpu_facts
from topology.kinds import default_bandwidth_gb_s, default_latency_us
from wire.kvevents import kv_events_config
from wire.lifecycle import follow_parent, serve_until_signalled
from wire.openai import ADMIN_TOKEN_ENV, API_KEY_ENV

TP_LINKS = ("nvlink", "pix", "pxb", "phb", "node", "sys", "rdma", "tcp")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value

def link_of_kind(kind_name: str, gpu: str) -> LinkCost:
    kind = LinkKind.parse(kind_name)
    facts = gpu_facts(gpu)
    if kind is LinkKind.NVLINK and facts.fabric == "nvswitch":
        kind = LinkKind.NVSWITCH
    lanes = facts.nvlink_lanes if kind in (LinkKind.NVLINK, LinkKind.NVSWITCH) else None
    gen, pcie = facts.nvlink_generation, facts.pcie_generation
    return LinkCost(bandwidth_gb_s=default_bandwidth_gb_s(kind, lanes, gen, pcie), latency_us=default_latency_us(kind))


def _placement(text: str) -> Placement:
    data: Any = _json_arg(text)
    return Placement(node=str(data["node"]), gpus=tuple(int(g) for g in data["gpus"]))


def _json_arg(text: str) -> object:
    return json.loads(Path(text).read_text() if not text.lstrip().startswith("{") else text)


def _gang(text: str, topology: Topology, placement: Placement, tp: int) -> tuple[GangCost, list[GpuRef]]:
    """`--gang`: the gang's shape, this engine's data-parallel rank and the gang's members (the
    placement's, `GangMember.to_json`); the gang's step cost (`physics.gang`) and this rank's
    TP group (stage 0)."""
    try:
        data = _json_arg(text)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        dp, pp, rank = int(data["dp"]), int(data.get("pp", 1)), int(data["dp_rank"])
        members = tuple(GangMember(node=str(m["node"]), gpus=tuple(int(g) for g in m["gpus"]),
                                   dp_rank_start=int(m["dp_rank_start"]), pp_stage=int(m.get("pp_stage", 0)),
                                   nic=None if m.get("nic") is None else str(m["nic"])) for m in data["members"])
        expert_parallel = bool(data.get("expert_parallel", False))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"--gang: want {{dp, pp, expert_parallel, dp_rank, members: [{{node, gpus, "
                         f"dp_rank_start, pp_stage, nic}}]}} ({type(err).__name__}: {err})") from None
    if dp < 1 or pp < 1 or dp * pp == 1:
        raise ValueError(f"--gang: dp={dp} pp={pp} is not a gang (dp x pp must be more than 1)")
    if not 0 <= rank < dp:
        raise ValueError(f"--gang: dp_rank {rank} is not a rank of dp={dp}")
    problems = _gang_problems(members, dp, pp, tp, topology)
    mine = [m for m in members if m.dp_rank_start == rank and m.pp_stage == 0]
    if mine and (mine[0].node, mine[0].gpus) != (placement.node, placement.gpus):
        problems.append(f"--placement {placement.node}:{list(placement.gpus)} is not rank {rank}'s first member "
                        f"{mine[0].node}:{list(mine[0].gpus)}")
    if problems:
        raise ValueError("--gang: " + "; ".join(problems))
    gang = ReplicaPlacement(replica_id="gang", pool="", role="mixed", node=members[0].node, gpus=members[0].gpus,
                            island="", tier="local", in_island=True, members=members, expert_parallel=expert_parallel)
    cost = GangCost(dp=dp, pp=pp, expert_parallel=expert_parallel,
                    links=gang_links(topology, gang) if expert_parallel else None,
                    boundaries=boundary_links(topology, gang) if pp > 1 else ())
    return cost, [GpuRef(m.node, g) for m in mine for g in m.gpus]


def _gang_problems(members: tuple[GangMember, ...], dp: int, pp: int, tp: int, topology: Topology) -> list[str]:
    """Every member's GPUs in the topology, tp GPUs per rank and stage, nothing outside the gang."""
    problems = [f"node {m.node} GPU {g} is not in the topology" for m in members for g in m.gpus
                if not topology.has_node(m.node) or not topology.node(m.node).has_gpu(g)]
    for k in range(dp):
        for s in range(pp):
            got = sum(len(m.gpus) for m in members if m.dp_rank_start == k and m.pp_stage == s)
            if got != tp:
                problems.append(f"rank {k} stage {s} has {got} GPUs for --tp {tp}")
    problems += [f"member rank {m.dp_rank_start} stage {m.pp_stage} is outside dp={dp} pp={pp}" for m in members
                 if not (0 <= m.dp_rank_start < dp and 0 <= m.pp_stage < pp)]
    return problems


def build(args: argparse.Namespace) -> SimEngine:
    if not args.time_scale > 0 or args.time_scale != args.time_scale:
        raise ValueError("--time-scale must be a positive number")
    if not is_loopback(args.host):
        raise ValueError(f"--host {args.host}: the simulated engine listens on loopback addresses only")
    model, gpu = catalog.model(args.model), catalog.gpu(args.gpu)
    link = link_of_kind(args.tp_link, args.gpu)
    topology, placement, gang = None, None, None
    if args.gang and not args.placement:
        raise ValueError("--gang needs --placement (this rank's first GPUs) and --topology")
    if args.placement:
        if not args.topology:
            raise ValueError("--placement needs --topology")
        topology = read_source(args.topology)
        placement = _placement(args.placement)
        refs = [GpuRef(placement.node, g) for g in placement.gpus]
        if args.gang:  # the rank's TP group may span the nodes of an NVLink domain
            gang, refs = _gang(args.gang, topology, placement, args.tp)
        elif len(placement.gpus) != args.tp:
            raise ValueError(f"--placement has {len(placement.gpus)} GPUs for --tp {args.tp}")
        if args.tp > 1:
            link = LinkCost.of(bottleneck(topology, refs))
        elif gang is not None:
            link = LOCAL
    events = kv_events_config(args.kv_events_config) if args.kv_events_config else None
    if events is not None and not args.enable_prefix_caching:
        raise ValueError("--kv-events-config publishes the prefix cache's events: it needs --enable-prefix-caching")
    lora, modules = _lora(args)
    config = EngineConfig(model=model, gpu=gpu, tp=args.tp, link=link, max_num_seqs=args.max_num_seqs,
                          max_num_batched_tokens=args.max_num_batched_tokens,
                          kv_capacity_tokens=args.num_gpu_blocks_override * args.block_size
                          if args.num_gpu_blocks_override else args.kv_capacity_tokens, gang=gang,
                          block_size=args.block_size,
                          prefix_caching=args.enable_prefix_caching, lora=lora)
    if config.capacity() < config.block_size:
        raise ValueError(f"{args.model} at tp={args.tp} leaves no room for KV cache on {args.gpu}")
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        raise ValueError("--enable-auto-tool-choice requires --tool-call-parser")  # as vLLM's cli_args.py
    identity = EngineIdentity(served_model=args.served_model_name or args.model,
                              engine_id=args.engine_id or uuid.uuid4().hex[:8], role=args.role, host=args.host,
                              port=args.port, placement=placement, topology=topology, kv_hold_s=args.kv_hold_s,
                              tools=ToolSetup(args.tool_call_parser, args.enable_auto_tool_choice),
                              reasoning_parser=args.reasoning_parser, source_model=args.model,
                              admin_routes=args.admin_routes, api_key=os.environ.get(API_KEY_ENV, "").strip(),
                              admin_token=os.environ.get(ADMIN_TOKEN_ENV, "") if args.admin_routes else "",
                              kv_events=events, lora_modules=modules,
                              lora_runtime=args.allow_runtime_lora_updating or runtime_updating(dict(os.environ)),
                              kv_load_failure_policy=args.kv_load_failure_policy)
    return SimEngine(config, identity, time_scale=args.time_scale)


def _lora(args: argparse.Namespace) -> tuple[LoraSpec | None, tuple[LoraModule, ...]]:
    """`--enable-lora` and its sizes, and the `--lora-modules` to register at start."""
    modules = tuple(parse_module(m) for m in args.lora_modules or () if m)
    if not args.enable_lora:
        if modules:
            raise ValueError("--lora-modules needs --enable-lora")
        return None, ()
    return LoraSpec(max_loras=args.max_loras, max_cpu_loras=args.max_cpu_loras,
                    max_lora_rank=args.max_lora_rank), modules


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
    p.add_argument("--gang", help='this engine is one data-parallel rank of a gang, its steps priced as the '
                   'gang\'s: {"dp": 4, "pp": 1, "expert_parallel": true, "dp_rank": 0, "members": [the '
                   'placement\'s members]} or a file with it (needs --placement, this rank\'s first member)')
    p.add_argument("--role", default="mixed", choices=["prefill", "decode", "mixed"])
    p.add_argument("--engine-id")
    p.add_argument("--served-model-name")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--kv-capacity-tokens", type=int, help="override the cache size the cost model gives")
    p.add_argument("--block-size", type=_positive, default=16, help="vLLM's: tokens per KV block "
                   "(the prefix cache's unit, and the KV events')")
    p.add_argument("--num-gpu-blocks-override", type=int, help="vLLM's: the KV cache in blocks (over "
                   "--kv-capacity-tokens)")
    p.add_argument("--kv-load-failure-policy", default="fail", choices=POLICIES,
                   help="vLLM's kv_transfer_config field: a failed KV read (admin fault kv_fail_rate) fails the "
                   "request with a 500 (fail, vLLM's default) or prefills it here (recompute)")
    p.add_argument("--kv-hold-s", type=float, default=60.0, help="how long a prefill keeps KV for its decode")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=False,
                   help="keep prompt blocks in a prefix cache as vLLM does (off by default here, unlike vLLM: the "
                        "published simulator figures were made without it)")
    p.add_argument("--kv-events-config", help="vLLM's: publish the prefix cache's events over ZMQ, e.g. "
                   '\'{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://127.0.0.1:5557", '
                   '"replay_endpoint": "tcp://127.0.0.1:5558", "topic": "decode-0"}\'')
    p.add_argument("--tool-call-parser", help="vLLM's: tool_choice 'required' and named functions need it (any name: "
                   "the simulated model writes one format)")
    p.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="vLLM's: tool_choice 'auto' (needs --tool-call-parser)")
    p.add_argument("--reasoning-parser", help="vLLM's (deepseek_r1, qwen3, ...): taken as vLLM takes it; the "
                   "simulated model writes no reasoning")
    p.add_argument("--enable-lora", action="store_true", help="vLLM's: serve LoRA adapters (a request's `model` "
                   "names one); VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 also serves /v1/load_lora_adapter and "
                   "/v1/unload_lora_adapter")
    p.add_argument("--max-loras", type=int, default=1, help="vLLM's: distinct adapters in one batch (GPU slots)")
    p.add_argument("--max-cpu-loras", type=int, help="vLLM's: adapters kept in host memory (default: --max-loras)")
    p.add_argument("--max-lora-rank", type=int, default=16, choices=MAX_LORA_RANKS,
                   help="vLLM's: the rank every adapter slot is sized for (prices loads and steps)")
    p.add_argument("--lora-modules", nargs="+", metavar="NAME=PATH",
                   help="vLLM's: adapters registered at start, name=path or JSON {\"name\", \"path\", "
                   "\"base_model_name\"} (the simulated engine reads no weights)")
    p.add_argument("--allow-runtime-lora-updating", action="store_true",
                   help="as VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 (which it also reads): serve /v1/load_lora_adapter and "
                   "/v1/unload_lora_adapter (for launchers that pass flags, not environment)")
    p.add_argument("--admin-routes", action="store_true",
                   help="serve /admin/faults and /admin/steps: fault injection and step records for tests and "
                        "chaos runs, never for production (anyone who reaches the port could fail every request)")
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
    gang = engine.config.gang
    rank = f", dp rank of {gang.dp} pp={gang.pp}" if gang is not None else ""
    desc = f"(model {engine.id.served_model}, {args.gpu} tp={args.tp} {args.tp_link}{rank}, role {args.role})"
    asyncio.run(serve_until_signalled(engine.start, engine.stop,
                                      lambda: f"isleserve sim-engine {desc} ready: {engine.url}/v1"))
    return 0



def add_parsers(sub: Any) -> None:
    """`sim-engine` of `python -m pools`: serve one simulated engine."""
    p = sub.add_parser("sim-engine", help="serve a simulated engine (OpenAI API, cost-model timing)")
    add_arguments(p)
    p.set_defaults(func=main)
