"""`python -m router --config FILE` (also `isle router`): serve the router standalone."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

from pools.routing import ReplicaEndpoint, RoutingTable
from router.config import RouterConfig, load_router_config
from router.keys import SALT_BYTES, salted
from router.server import Router
from topology import Topology, TopologyError, read_source
from wire import native
from wire.lifecycle import serve_until_signalled


def table_from_config(config: RouterConfig) -> RoutingTable:
    return RoutingTable(version=1, replicas=tuple(
        ReplicaEndpoint(replica_id=r.replica_id, url=r.url, model=r.model, pool=r.pool, role=r.role, node=r.node,
                        gpus=tuple(r.gpus), island=r.island, tier=r.tier, tp=r.tp, gpu_model=r.gpu_model,
                        catalog_model=r.catalog_model, slo_classes=tuple(r.slo_classes),
                        expert_parallel=r.expert_parallel, kv_events_replay=r.kv_events_replay, engine=r.engine,
                        max_num_seqs=r.max_num_seqs or config.fair.replica_max_num_seqs) for r in config.replicas))


def build_router(config: RouterConfig) -> Router:
    topology: Topology | None = read_source(config.topology) if config.topology else None
    return Router(config, table_from_config(config), topology)


def bench(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m router bench", description="ours vs nginx vs vllm-router")
    parser.add_argument("--format", choices=["json", "text"], default="text")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=2, help="our router's worker processes (config `workers`)")
    parser.add_argument("--servers", action="store_true", help="also the floor of a router on uvicorn (httptools) "
                        "and on granian: an ASGI app relaying through our relay, no routing")
    parser.add_argument("--front-door", action="store_true", help="instead: the front-door probes (issue 15's "
                        "attacks) against our connection layer, uvicorn and granian, each serving one echo app")
    parser.add_argument("--scrape", type=int, metavar="REQUESTS", help="instead: the router's /metrics at "
                        "configs/local.yaml's shape after REQUESTS requests (four simulated engines): its size and "
                        "the time a scrape takes")
    args = parser.parse_args(argv)
    if args.scrape is not None:
        import tempfile
        from pathlib import Path

        from router.bench.scrape import main as scrape_main

        with tempfile.TemporaryDirectory(prefix="isle-scrape-") as directory:
            return scrape_main(args.format, args.scrape, max(50, args.reps * 100), Path(directory))
    from router.bench.run import main as bench_main

    return bench_main(args.format, args.reps, args.seconds, args.workers, args.servers, args.front_door)


def hash_key(argv: Sequence[str]) -> int:
    """`python -m router hash-key [--salt HEX]`: a key from stdin (one line; never an argument,
    which other users could read in the process table) as a config's `key_hmac_sha256` value."""
    parser = argparse.ArgumentParser(prog="python -m router hash-key", description=hash_key.__doc__)
    parser.add_argument("--salt", help="the deployment's salt in hex (at least 16 bytes); default: a new one "
                                       "(give every key of one deployment the same salt)")
    args = parser.parse_args(argv)
    try:
        salt = bytes.fromhex(args.salt) if args.salt else None
    except ValueError:
        print("error: --salt must be hex", file=sys.stderr)
        return 2
    if salt is not None and len(salt) < SALT_BYTES:
        print(f"error: --salt must be at least {SALT_BYTES} bytes ({2 * SALT_BYTES} hex digits)", file=sys.stderr)
        return 2
    key = sys.stdin.readline().strip()
    if not key:
        print("error: no key on standard input", file=sys.stderr)
        return 2
    print(salted(key, salt))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        return bench(argv[1:])
    if argv[:1] == ["hash-key"]:
        return hash_key(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m router", description="the isleserve router, standalone")
    parser.add_argument("--config", required=True)
    parser.add_argument("--port", type=int, help="override the config's port (0: any free port)")
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        config = load_router_config(args.config)
        if args.port is not None:
            config = config.model_copy(update={"port": args.port})
        router = build_router(config)
    except (TopologyError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"isleserve router: request path: {native.explain()}", file=sys.stderr, flush=True)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve_until_signalled(
        router.start, router.stop, lambda: f"isleserve router ready: http://{router.config.host}:{router.port}/v1"))
    return 0
