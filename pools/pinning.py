"""Where a replica runs, in Ray's and the operating system's terms (pure: no Ray, no I/O).

A placement names a node and GPU indices. To hold exactly those GPUs the replica actor asks
Ray for one unit of each per-GPU custom resource `isle_gpu_<node>_<i>` that `python -m pools
node-labels` declares on the node (so no two replicas, and no other Ray workload that asks
for them, can hold the same GPU), and is tied to the node's Ray id by node affinity. Ray's own
`num_gpus` is left out: mixing both accounting schemes lets a plain `num_gpus` actor land on
GPUs a replica really uses. The engine then gets:

- `CUDA_VISIBLE_DEVICES`: the planned indices, ordered by PCI bus id, with
  `CUDA_DEVICE_ORDER=PCI_BUS_ID` (NVML and nvidia-smi number GPUs in PCI order; CUDA's default
  order is "fastest first", which would make the indices mean other GPUs);
- CPU affinity to the CPUs of the GPUs' NUMA node, when the topology knows them and the host has
  them all (a simulated node's CPU list rarely fits the machine that simulates it);
- the nearest NICs (best PCIe level to the group's GPUs) as `NCCL_IB_HCA` and `UCX_NET_DEVICES`
  (`<device>:1`) for RDMA devices, `NCCL_SOCKET_IFNAME` and `UCX_NET_DEVICES` for plain network
  interfaces or a TCP fabric.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from pools.model import ReplicaPlacement
from pools.nodelabels import resource_name
from topology import Topology
from topology.model import Nic, Node
from topology.readers.cpus import format_cpu_list, parse_cpu_list

_NETDEV = re.compile(r"^(eth|en|em|bond|p\d)\w*$")


@dataclass(frozen=True, slots=True, kw_only=True)
class Pin:
    node: str
    """The planned (topology) node."""
    ray_node_id: str | None = None
    """The Ray node that carries it; None for a simulated node no Ray node carries (runs anywhere)."""
    resources: Mapping[str, float] = field(default_factory=dict)
    """Per-GPU custom resources the actor holds (only those its Ray node declares)."""
    env: Mapping[str, str] = field(default_factory=dict)
    cpus: tuple[int, ...] = ()
    """The GPUs' NUMA CPUs for the engine process; () leaves it alone. Applied on the engine's
    host only when that host has them all (`host_affinity`)."""
    notes: tuple[str, ...] = ()
    """Why something was not pinned (shown by info() and recorded)."""
    rdma: bool = False
    """The fabric is RDMA: the engine's network traffic should take the NICs' RDMA transports
    (`pools.transportenv` checks the engine's environment against it)."""


def gpu_resource(node: str, index: int) -> str:
    return f"isle_gpu_{resource_name(node)}_{index}"


def visible_devices(node: Node, gpus: tuple[int, ...]) -> str:
    """Indices in PCI bus order (by index when a bus id is unknown: NVML's order is PCI order)."""
    known = [node.gpu(g) for g in gpus if node.has_gpu(g)]
    if len(known) == len(gpus) and all(g.pci_bus_id for g in known):
        ordered = [g.index for g in sorted(known, key=lambda g: str(g.pci_bus_id).lower())]
    else:
        ordered = sorted(gpus)
    return ",".join(str(i) for i in ordered)


def numa_cpus(node: Node, gpus: tuple[int, ...]) -> tuple[tuple[int, ...], str | None]:
    """The CPU list of the GPUs' NUMA node(s), or () and why not."""
    lists = [node.gpu(g).cpu_affinity for g in gpus if node.has_gpu(g)]
    if not lists or any(not text for text in lists):
        return (), "CPU affinity unknown for these GPUs: left to the OS"
    try:
        return tuple(sorted({c for text in lists for c in parse_cpu_list(str(text))})), None
    except ValueError as err:
        return (), f"CPU affinity not applied: {err}"


def host_affinity(cpus: tuple[int, ...], host_cpus: frozenset[int]) -> tuple[tuple[int, ...], str | None]:
    """What the engine's host can apply: all of `cpus`, or nothing and why (decided on that host)."""
    if not cpus:
        return (), None
    missing = sorted(set(cpus) - host_cpus)
    if missing:
        return (), f"CPU affinity {format_cpu_list(list(cpus))} not applied: this host lacks CPUs " \
                   f"{format_cpu_list(missing)}"
    return cpus, None


def nearest_nics(node: Node, gpus: tuple[int, ...]) -> list[Nic]:
    """NICs at the best PCIe level to any of the GPUs (one rail per GPU on HGX boards)."""
    best: dict[str, tuple[int, Nic]] = {}
    for nic in node.nics:
        levels = [lv for g in gpus if (lv := nic.level_to(g)) is not None]
        if levels and any(g in nic.nearest_gpus for g in gpus):
            best[nic.name] = (max(levels), nic)
    if not best:
        return []
    top = max(level for level, _ in best.values())
    return sorted((nic for level, nic in best.values() if level == top), key=lambda n: n.name)


def nic_env(nics: list[Nic], rdma: bool) -> dict[str, str]:
    """RDMA devices (mlx5_0, rdma0: InfiniBand or RoCE) for NCCL's IB transport; plain network
    interfaces (eth0, ens1f0) or a TCP fabric for its socket transport."""
    if not nics:
        return {}
    names = [n.name for n in nics]
    if rdma and not all(_NETDEV.match(n) for n in names):
        return {"NCCL_IB_HCA": ",".join(names), "UCX_NET_DEVICES": ",".join(f"{n}:1" for n in names)}
    return {"NCCL_SOCKET_IFNAME": ",".join(names), "UCX_NET_DEVICES": ",".join(names)}


def pin_for(topology: Topology, placement: ReplicaPlacement, ray_node_id: str | None,
            ray_resources: Mapping[str, float]) -> Pin:
    """`ray_resources`: what the Ray node declares (per-GPU resources it lacks are not asked for)."""
    node = topology.node(placement.node)
    notes: list[str] = []
    resources: dict[str, float] = {}
    if ray_node_id is None:
        notes.append(f"no Ray node carries {placement.node}: the replica runs on any node (simulation)")
    else:
        for g in placement.gpus:
            name = gpu_resource(placement.node, g)
            if name in ray_resources:
                resources[name] = 1.0
            else:
                notes.append(f"Ray node lacks resource {name}: pinned by node affinity only")
    env = {"CUDA_VISIBLE_DEVICES": visible_devices(node, placement.gpus), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    rdma = topology.fabric.kind.name == "RDMA"
    env.update(nic_env(nearest_nics(node, placement.gpus), rdma=rdma))
    cpus, why = numa_cpus(node, placement.gpus)
    if why:
        notes.append(why)
    return Pin(node=placement.node, ray_node_id=ray_node_id, resources=resources, env=env, cpus=cpus,
               notes=tuple(notes), rdma=rdma)


def pin_cpus(pid: int, cpus: tuple[int, ...], notes: list[str]) -> None:
    """Bind a just-started engine to its NUMA node's CPUs (set right after the exec, before it
    starts threads, which inherit it); what could not be applied goes to `notes`, once."""
    allowed, why = host_affinity(cpus, frozenset(os.sched_getaffinity(0)))
    if why and why not in notes:
        notes.append(why)
    if allowed:
        try:
            os.sched_setaffinity(pid, allowed)
        except OSError as err:
            notes.append(f"CPU affinity not applied: {err.strerror}")
