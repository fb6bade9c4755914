"""The control plane's subcommands of `python -m pools`: `mark-link`, `replace` and
`stop-controller` (the running controller, through Ray) and `launch` (the vLLM command of each node of a planned gang
replica)."""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

from pools.config import load_pools


def _controller(address: str) -> Any:
    """The running controller actor (connects this process to the Ray cluster)."""
    import ray

    from control.controller import CONTROLLER_NAME, NAMESPACE

    try:
        ray.init(address=address, namespace=NAMESPACE, logging_level=logging.ERROR, log_to_driver=False)
    except ConnectionError as err:
        raise ValueError(f"no Ray cluster at {address}: {err}") from None
    try:
        return ray.get_actor(CONTROLLER_NAME, namespace=NAMESPACE)
    except ValueError:
        raise ValueError("no isleserve controller runs on this Ray cluster (deploy configs/*.yaml first)") from None


def cmd_mark_link(args: argparse.Namespace) -> int:
    """Tell the running controller that a link is down (or back): it drains and re-places."""
    import ray

    call: Any = _controller(args.address).mark_link.remote(args.node, args.gpu_a, args.gpu_b, args.healthy,
                                                           args.reason or "")
    moves: list[dict[str, object]] = ray.get(call)
    print(json.dumps({"moves": moves}, indent=2))
    return 0


def cmd_replace(args: argparse.Namespace) -> int:
    """Tell the running controller to move one replica (make-before-break) off its GPUs and NICs."""
    import ray

    call: Any = _controller(args.address).replace_replica.remote(args.replica, args.reason or "")
    try:
        moves: list[dict[str, object]] = ray.get(call)
    except ray.exceptions.RayTaskError as err:
        if isinstance(err.cause, ValueError):  # no such replica, or no room: one line, exit 2
            raise ValueError(str(err.cause)) from None
        raise
    print(json.dumps({"moves": moves}, indent=2))
    return 0


def cmd_stop_controller(args: argparse.Namespace) -> int:
    """Stop every replica and the controller (`serve shutdown` leaves them: they are detached)."""
    import ray

    controller = _controller(args.address)
    ray.get(controller.shutdown.remote())
    ray.kill(controller, no_restart=True)
    print("isleserve controller and its replicas stopped")
    return 0


def cmd_launch(args: argparse.Namespace) -> int:
    """The vLLM processes that start one gang replica of a plan, node by node."""
    from control.replicas.vllm.gang import EplbSettings, GangSettings, gang_launches
    from pools.model import placement_from_json

    try:
        with open(args.plan, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"--plan {args.plan}: {err}") from None
    pools = {p.name: p for p in load_pools(args.pools).pool_specs()}
    if args.pool not in pools:
        raise ValueError(f"--pool {args.pool}: not in {args.pools} ({', '.join(pools)})")
    found = [p for p in doc.get("placements", []) if p.get("pool") == args.pool
             and (args.replica is None or p.get("replica_id") == args.replica)]
    if not found:
        raise ValueError(f"{args.plan} places no replica {args.replica or ''} of pool {args.pool}".replace("  ", " "))
    placement = placement_from_json(found[0])
    # vLLM takes no static expert map: a pool's redundant experts go to its own EPLB
    wanted = pools[args.pool].experts
    redundant = args.eplb_redundant if args.eplb_redundant is not None else (
        wanted.redundant if wanted is not None and wanted.redundant else None)
    eplb = None if redundant is None else EplbSettings(num_redundant_experts=redundant)
    # with EPLB on, the isleserve vLLM plugin replaces vLLM's policy (unless the pool asks for eplb;
    # a pipelined gang keeps vLLM's: its EP ranks per stage are not planned here)
    spec = None
    if eplb is not None and (wanted is None or wanted.policy == "topology") and pools[args.pool].pp == 1:
        from pools.experts.engine import spec_for

        spec = spec_for(placement, pools[args.pool].model, args.gpu,
                        locality=wanted.locality if wanted is not None else True)
    settings = GangSettings(model=args.model or pools[args.pool].model or args.pool, address=args.address,
                            port=args.port, rpc_port=args.rpc_port, external_lb=args.external_lb, eplb=eplb,
                            expert_spec=spec, expert_load_dir=args.expert_load_dir)
    launches = gang_launches(placement, pools[args.pool], settings)
    if args.format == "json":
        keys = ("node", "argv", "env", "dp_ranks", "headless")
        print(json.dumps([{k: v for k, v in launch.to_json().items() if k in keys} for launch in launches], indent=2))
    else:
        import shlex

        for launch in launches:
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(launch.env.items()))
            print(f"# {launch.node}: DP ranks {list(launch.dp_ranks)}{' (headless)' if launch.headless else ''}")
            print(f"{env} {shlex.join(launch.argv)}")
    return 0


def _launch_parser(sub: Any) -> None:
    p = sub.add_parser("launch", help="the vLLM command of each node of a planned gang replica")
    p.add_argument("--plan", required=True, help="PLAN.json as `plan --format json` prints it")
    p.add_argument("--pools", required=True, help="the POOLS.yaml the plan was made with (tp, dp, pp, ep)")
    p.add_argument("--pool", required=True)
    p.add_argument("--replica", help="replica id (default: the pool's first)")
    p.add_argument("--model", help="model id or directory (default: the pool's model)")
    p.add_argument("--address", default="127.0.0.1", help="the head node's address (--data-parallel-address)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--rpc-port", type=int, default=29550)
    p.add_argument("--external-lb", action="store_true", help="one API server per DP rank")
    p.add_argument("--eplb-redundant", type=int, metavar="R", help="enable EPLB with R redundant experts")
    p.add_argument("--gpu", help="catalogue GPU pricing the expert map's step (default: h100-sxm)")
    p.add_argument("--expert-load-dir", metavar="DIR",
                   help="where the isleserve vLLM plugin writes each EPLB load window (ISLE_EXPERT_LOAD_DIR)")
    p.add_argument("--format", choices=["json", "text"], default="text")
    p.set_defaults(func=cmd_launch)


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("mark-link", help="mark a link unhealthy (or healthy again) in the running controller")
    p.add_argument("node")
    p.add_argument("gpu_a", type=int)
    p.add_argument("gpu_b", type=int)
    p.add_argument("--healthy", action="store_true", help="the link is back in service")
    p.add_argument("--reason", help="recorded with the change")
    p.add_argument("--address", default="auto", help="Ray address (default: the running cluster)")
    p.set_defaults(func=cmd_mark_link)
    p = sub.add_parser("replace", help="move a replica (make-before-break) off its GPUs and NICs in the running "
                                       "controller: a PD pair on the wrong path")
    p.add_argument("replica", help="replica id (`isle status`, /admin/replicas)")
    p.add_argument("--reason", help="recorded with the move")
    p.add_argument("--address", default="auto", help="Ray address (default: the running cluster)")
    p.set_defaults(func=cmd_replace)
    p = sub.add_parser("stop-controller", help="stop the detached controller and every replica it started")
    p.add_argument("--address", default="auto", help="Ray address (default: the running cluster)")
    p.set_defaults(func=cmd_stop_controller)
    _launch_parser(sub)
