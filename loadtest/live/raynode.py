"""`python -m loadtest.live.raynode --address GCS --resources JSON --labels JSON`: one more Ray node on
this machine, joined to a head of our own, on loopback only; it runs until it is killed.

The chaos run declares a simulated topology node on it (the `isle_gpu_<node>_<i>` resources and
`isle.io/` labels that `python -m pools node-labels` gives that node), so the controller pins that
node's replicas here; killing this process's session is a node lost.

Why not `ray start --address`: on a worker node the CLI refuses to run unless multi-node clusters
are enabled (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1`), and then it rewrites 127.0.0.1 to the
machine's outward address, where the head (bound to loopback) does not listen. This starts the
node as `ray.cluster_utils.Cluster.add_node` does, with the node's address given as 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtest.live.raynode", description=__doc__.split("\n\n")[0])
    p.add_argument("--address", required=True, help="the head's GCS address, 127.0.0.1:PORT")
    p.add_argument("--resources", default="{}", help="custom resources as JSON")
    p.add_argument("--labels", default="{}", help="node labels as JSON")
    p.add_argument("--num-cpus", type=int, default=1)
    p.add_argument("--num-gpus", type=int, default=0, help="GPUs the node declares (Ray keeps work that needs none "
                   "off GPU nodes while others have room)")
    p.add_argument("--object-store-mb", type=int, default=100)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    import ray._private.node
    import ray._private.parameter

    params = ray._private.parameter.RayParams(
        gcs_address=args.address, node_ip_address="127.0.0.1", num_cpus=args.num_cpus, num_gpus=args.num_gpus,
        resources=json.loads(args.resources), labels=json.loads(args.labels),
        object_store_memory=args.object_store_mb * 1024 * 1024, min_worker_port=0, max_worker_port=0,
        node_manager_port=0)
    untyped: Any = params  # RayParams types this flag as a string
    untyped.include_log_monitor = False  # one log monitor per machine: the head's
    params.dashboard_agent_listen_port = None  # a free one: the head's agent has the default
    node = ray._private.node.Node(params, head=False, shutdown_at_exit=False, spawn_reaper=False)
    print(f"ray node ready: {node.node_id}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    node.kill_all_processes(check_alive=False, allow_graceful=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
