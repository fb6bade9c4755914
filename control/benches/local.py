"""Running the topology bench for the controller, without Ray: one node's bench on this host
(`bench_node`, what a Ray task runs on its node), one rank of a two-node bench (`bench_rank`),
and a local backend's run of every subject on this host (`bench_here`). torch is needed only
where a bench runs (the `bench` extra), and imported there, lazily."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from control.benches.schedule import Subject
from topology import Topology
from topology.bench.plan import Probe, plan_between, plan_probes
from topology.bench.record import BenchRecord
from topology.bench.run import BenchSettings, free_port, record_between, run, run_rank, started_now
from topology.errors import TopologyError


def node_topology(topology: Topology, node: str) -> Topology:
    """What a node's bench needs (a small thing to ship to the node)."""
    return Topology(nodes=(topology.node(node),), fabric=topology.fabric, name=topology.name)


def pair_topology(topology: Topology, a: str, b: str) -> Topology:
    return Topology(nodes=(topology.node(a), topology.node(b)), fabric=topology.fabric, name=topology.name)


def bench_node(topology: Topology, node: str, settings: BenchSettings, source: str) -> BenchRecord:
    return run(topology, node, plan_probes(topology, node), source, settings)


def bench_rank(probes: Sequence[Probe], rank: int, master: str, port: int, backend: str,
               settings: BenchSettings) -> dict[int, dict[str, float]]:
    return run_rank(probes, rank, master, port, backend, settings)


def pair_backend(settings: BenchSettings) -> str:
    """Both ranks must agree: NCCL only when asked for (the controller does so on NVML nodes)."""
    return "nccl" if settings.backend == "nccl" else "gloo"


def rounds(pairs: Sequence[Subject]) -> list[list[Subject]]:
    """Pairs grouped so that no node is in two benches of one round (they would disturb each other)."""
    out: list[list[Subject]] = []
    for pair in pairs:
        for group in out:
            if not {n for s in group for n in s.nodes} & set(pair.nodes):
                group.append(pair)
                break
        else:
            out.append([pair])
    return out


def _pair_here(topology: Topology, subject: Subject, settings: BenchSettings, source: str) -> BenchRecord:
    a, b = subject.nodes
    probes, backend, port, started = plan_between(topology, a, b), pair_backend(settings), free_port(), started_now()
    with ThreadPoolExecutor(2) as pool:
        ranks = [pool.submit(bench_rank, probes, r, "127.0.0.1", port, backend, settings) for r in (0, 1)]
        found = [f.result() for f in ranks]
    return record_between(pair_topology(topology, a, b), probes, found[0], backend, source, started, settings)


def bench_here(topology: Topology, due: Sequence[Subject], settings: BenchSettings, source: str
               ) -> dict[str, BenchRecord | str]:
    """Every subject on this host, one after the other; a failure is its message."""
    out: dict[str, BenchRecord | str] = {}
    for s in due:
        try:
            if len(s.nodes) == 1:
                out[s.key] = bench_node(node_topology(topology, s.nodes[0]), s.nodes[0], settings, source)
            else:
                out[s.key] = _pair_here(topology, s, settings, source)
        except (TopologyError, OSError) as err:
            out[s.key] = str(err)
    return out
