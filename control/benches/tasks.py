"""The topology bench on a Ray cluster: one task per node, pinned there by node affinity (all
nodes at once), then the pairs of nodes, one rank on each (rounds in which no node is in two
pairs). Each answer is a record, or why there is none."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from control.benches.local import bench_node, bench_rank, node_topology, pair_backend, pair_topology, rounds
from control.benches.schedule import Subject
from topology import Topology
from topology.bench.plan import plan_between
from topology.bench.record import BenchRecord
from topology.bench.run import BenchSettings, free_port, record_between, started_now

log = logging.getLogger("isleserve.controller")
_remote: Any = ray.remote
_node_task: Any = _remote(num_cpus=0, max_retries=0)(bench_node)
_rank_task: Any = _remote(num_cpus=0, max_retries=0)(bench_rank)


def _endpoint() -> tuple[str, int]:
    """This node's address and a free port on it (rank 0 of a pair listens there)."""
    return str(ray.util.get_node_ip_address()), free_port()  # type: ignore[no-untyped-call]


_endpoint_task: Any = _remote(num_cpus=0)(_endpoint)


def _on(ray_id: str) -> dict[str, Any]:
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(ray_id, soft=False)}


def _get(refs: list[Any], timeout_s: float) -> list[Any]:
    try:
        return list(ray.get(refs, timeout=timeout_s))
    except BaseException:
        for ref in refs:
            ray.cancel(ref, force=True)
        raise


def _pair(topology: Topology, s: Subject, settings: BenchSettings, source: str) -> Any:
    """Start a pair's two ranks; returns what `_finish_pair` needs."""
    a, b = s.nodes
    probes, backend = plan_between(topology, a, b), pair_backend(settings)
    master, port = ray.get(_endpoint_task.options(**_on(s.ray_ids[0])).remote(), timeout=60)
    refs = [_rank_task.options(**_on(s.ray_ids[r])).remote(probes, r, master, port, backend, settings)
            for r in (0, 1)]
    return probes, backend, started_now(), refs


def bench_on_ray(topology: Topology, due: Sequence[Subject], settings: BenchSettings, source: str
                 ) -> dict[str, BenchRecord | str]:
    timeout_s = settings.timeout_s + 60
    out: dict[str, BenchRecord | str] = {}
    nodes = [s for s in due if len(s.nodes) == 1 and s.ray_ids]
    refs = {s.key: _node_task.options(**_on(s.ray_ids[0])).remote(node_topology(topology, s.nodes[0]), s.nodes[0],
                                                                  settings, source) for s in nodes}
    for key, ref in refs.items():
        try:
            out[key] = _get([ref], timeout_s)[0]
        except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError) as err:
            out[key] = f"bench on node {key} failed: {err}"
    for group in rounds([s for s in due if len(s.nodes) == 2 and len(s.ray_ids) == 2]):
        started = {}
        for s in group:
            try:
                started[s.key] = (s, _pair(topology, s, settings, source))
            except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError) as err:
                out[s.key] = f"bench between {s.key} failed to start: {err}"
        for key, (s, (probes, backend, at, pair_refs)) in started.items():
            try:
                found = _get(pair_refs, timeout_s)[0]
                out[key] = record_between(pair_topology(topology, *s.nodes), probes, found, backend, source, at,
                                          settings)
            except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError) as err:
                out[key] = f"bench between {key} failed: {err}"
    for s in due:
        out.setdefault(s.key, f"no Ray node carries {s.key}: not measured")
    return out
