"""A readable text account of a topology: nodes, islands, cliques, NICs, unhealthy links."""

from __future__ import annotations

from collections.abc import Sequence

from topology.islands import cliques, islands
from topology.model import GpuRef, Topology
from topology.readers.cpus import format_cpu_list


def format_gpus(refs: Sequence[GpuRef], single_node: bool = False) -> str:
    """'{0-3,6}' on one node, '{h100-0:0-7 h100-1:0-3}' across nodes, summarised past 3 nodes."""
    by_node: dict[str, list[int]] = {}
    for r in refs:
        by_node.setdefault(r.node, []).append(r.index)
    if single_node and len(by_node) == 1:
        return "{" + format_cpu_list(next(iter(by_node.values()))) + "}"
    if len(by_node) > 3:
        names = sorted(by_node)
        return f"{{{len(refs)} GPUs on {len(names)} nodes {names[0]}..{names[-1]}}}"
    return "{" + " ".join(f"{n}:{format_cpu_list(ix)}" for n, ix in sorted(by_node.items())) + "}"


def describe(topology: Topology) -> str:
    lines = [f"topology {topology.name or '(unnamed)'}  fingerprint {topology.fingerprint()}  "
             f"{len(topology.nodes)} node(s), {topology.gpu_count} GPU(s), fabric {topology.fabric.technology}"]
    isl = islands(topology)
    cl = cliques(topology)
    for node in topology.nodes:
        where = f" rack {node.rack}" if node.rack else ""
        model = node.gpus[0].model if node.gpus and node.gpus[0].model else "GPU"
        lines.append(f"\nnode {node.name}{where}: {len(node.gpus)}x {model} ({node.machine or node.source_format})")
        singles = [i.gpus[0].index for i in isl if node.name in i.nodes and i.size == 1]
        for i in isl:
            if node.name in i.nodes and i.size > 1:
                members = format_gpus([g for g in i.gpus if g.node == node.name], single_node=True)
                span = f" spanning {len(i.nodes)} nodes" if len(i.nodes) > 1 else ""
                kind = i.kind.label if i.kind else "none"
                full = "fully connected" if i.fully_connected else "not fully connected"
                lines.append(f"  island {i.id}: GPUs {members} ({kind}, {full}, "
                             f"bottleneck {i.bottleneck_gb_s:g} GB/s){span}")
        if singles:
            lines.append(f"  single-GPU islands (no NVLink): GPUs {format_cpu_list(singles)}")
        node_cliques = [c for c in cl if all(g.node == node.name for g in c) and len(c) > 2]
        if node_cliques and any(not i.fully_connected for i in isl if node.name in i.nodes):
            lines.append("  cliques: " + " ".join("{" + ",".join(str(g.index) for g in c) + "}" for c in node_cliques))
        for nic in sorted(node.nics, key=lambda n: n.name):
            speed = f" {nic.speed_gbit_s:g} Gb/s" if nic.speed_gbit_s else ""
            lines.append(f"  nic {nic.name}{speed}: nearest GPUs {list(nic.nearest_gpus)} ({nic.level.name})")
        for link in node.links:
            if not link.health.healthy or link.health.reasons:
                state = "UNHEALTHY" if not link.health.healthy else "degraded"
                lines.append(f"  {state} GPU{link.a}-GPU{link.b} score {link.health.score:g}: "
                             + "; ".join(link.health.reasons))
        for g in node.gpus:
            if not g.healthy:
                lines.append(f"  UNHEALTHY GPU{g.index}: " + "; ".join(g.health_reasons))
        for note in node.notes:
            lines.append(f"  note: {note}")
    return "\n".join(lines) + "\n"
