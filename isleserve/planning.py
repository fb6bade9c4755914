"""What a deployment's settings come to without Ray: its topology (read, or discovered through a
callback) and the plan it would make (pools sized first when `replicas: auto`). The app, the
live load tests and the calibration use the same answer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from isleserve.settings import AppArgs
from pools.config import auto_counts, size_auto_pairs
from pools.model import PlacementPlan, PlacementRequest
from pools.placement import get_policy
from topology import Topology
from topology.errors import ParseError
from topology.readers import read_source


def resolve_topology(args: AppArgs, discover: Callable[[], Topology] | None = None,
                     base: Path | None = None) -> Topology:
    """The cluster topology: discovered (`nvml`, via `discover`: one task per Ray node) or read."""
    if args.topology == "nvml":
        if discover is None:
            raise ParseError("topology nvml needs discovery on the cluster's nodes")
        return discover()
    source = Path(args.topology)
    if not source.is_absolute() and base is not None and not source.exists():
        source = base / source
    return read_source(str(source))


def plan_for(args: AppArgs, topology: Topology) -> PlacementPlan:
    """The placement the deployment would make (no Ray needed): pools sized if `auto`."""
    config = args.pools_config()
    counts = auto_counts(size_auto_pairs(config, topology, args.workload))
    request = PlacementRequest(topology=topology, pools=config.pool_specs(counts), slo_classes=config.classes())
    return get_policy(args.policy).place(request)
