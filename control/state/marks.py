"""What the controller knows beyond discovery (pure): links marked by an operator or a probe,
and nodes that left the cluster. The effective topology is the discovered one with both applied;
its fingerprint changes with every mark, so plans and records say which graph they were for."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, replace

from topology import LinkHealth, Topology
from topology.model import Node


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkMark:
    """A link taken out of service (its score 0: it leaves its island, TP groups avoid it)."""

    node: str
    a: int
    b: int
    reason: str

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.node, min(self.a, self.b), max(self.a, self.b))


def check_mark(topology: Topology, node: str, a: int, b: int) -> None:
    """ValueError naming what is wrong when the link does not exist."""
    if not topology.has_node(node):
        raise ValueError(f"no node {node!r} (nodes: {', '.join(n.name for n in topology.nodes)})")
    if a == b or topology.node(node).link(a, b) is None:
        raise ValueError(f"node {node} has no link GPU{a}-GPU{b}")


def _marked(node: Node, marks: list[LinkMark]) -> Node:
    by_pair = {(m.key[1], m.key[2]): m for m in marks}
    links = []
    for link in node.links:
        m = by_pair.get((link.a, link.b))
        if m is None:
            links.append(link)
        else:
            links.append(replace(link, health=LinkHealth(score=0.0, healthy=False, bandwidth_factor=0.0,
                                                         reasons=(m.reason,))))
    return replace(node, links=tuple(links))


def effective(discovered: Topology, marks: Iterable[LinkMark], lost: Collection[str]) -> Topology:
    """The discovered topology with marks applied and lost nodes removed (same node objects where
    nothing changed, so a re-plan re-checks only what did)."""
    per_node: dict[str, list[LinkMark]] = {}
    for m in marks:
        per_node.setdefault(m.node, []).append(m)
    nodes = tuple(_marked(n, per_node[n.name]) if n.name in per_node else n
                  for n in discovered.nodes if n.name not in lost)
    if len(nodes) == len(discovered.nodes) and not per_node:
        return discovered
    return replace(discovered, nodes=nodes)
