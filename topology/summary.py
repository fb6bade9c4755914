"""A readable text account of a topology: nodes, islands, cliques, NICs, unhealthy links."""

from __future__ import annotations

from topology.islands import cliques, islands
from topology.model import Topology


def describe(topology: Topology) -> str:
    lines = [f"topology {topology.name or '(unnamed)'}  fingerprint {topology.fingerprint()}  "
             f"{len(topology.nodes)} node(s), {topology.gpu_count} GPU(s), fabric {topology.fabric.technology}"]
    isl = islands(topology)
    cl = cliques(topology)
    for node in topology.nodes:
        where = f" rack {node.rack}" if node.rack else ""
        model = node.gpus[0].model if node.gpus and node.gpus[0].model else "GPU"
        lines.append(f"\nnode {node.name}{where}: {len(node.gpus)}x {model} ({node.machine or node.source_format})")
        for i in isl:
            if node.name in i.nodes:
                members = ",".join(str(g.index) for g in i.gpus if g.node == node.name)
                span = f" spanning {len(i.nodes)} nodes" if len(i.nodes) > 1 else ""
                kind = i.kind.label if i.kind else "none"
                full = "fully connected" if i.fully_connected else "not fully connected"
                lines.append(f"  island {i.id}: GPUs {members} ({kind}, {full}, "
                             f"bottleneck {i.bottleneck_gb_s:g} GB/s){span}")
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
