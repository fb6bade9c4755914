"""Islands (connected components over healthy GPU-fabric links) and cliques (fully connected sets).

An island is where a tensor-parallel group may live; a clique is where it lives without
multi-hop paths. They differ on bridge and mesh machines: a DGX-1 hybrid cube mesh is one
island of 8 whose largest cliques have 4 GPUs. GPUs of different nodes that report the same
NVLink fabric clique (GB200 NVL72) belong to one island, reached through NVLink switches.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from itertools import combinations

from topology.kinds import NVLINK_LANE_GB_S, LinkKind
from topology.model import GpuRef, Island, Node, Topology

Adjacency = dict[GpuRef, set[GpuRef]]


def fabric_clique_bandwidth_gb_s(topology: Topology, ref: GpuRef) -> float:
    """Per-GPU NVLink bandwidth into a multi-node NVLink domain (18 lanes of its generation)."""
    gen = topology.gpu(ref).nvlink_generation or 5
    return 18 * NVLINK_LANE_GB_S.get(gen, 50.0)


def _healthy_refs(node: Node) -> set[int]:
    return {g.index for g in node.gpus if g.healthy}


def adjacency(topology: Topology) -> Adjacency:
    """Island edges: healthy NVLink/NVSwitch/XGMI links plus shared fabric cliques."""
    adj: Adjacency = {ref: set() for ref in topology.gpu_refs()}
    domains: dict[str, list[GpuRef]] = {}
    for node in topology.nodes:
        healthy = _healthy_refs(node)
        for link in node.links:
            if link.joins_island and link.a in healthy and link.b in healthy:
                ra, rb = GpuRef(node.name, link.a), GpuRef(node.name, link.b)
                adj[ra].add(rb)
                adj[rb].add(ra)
        for gpu in node.gpus:
            if gpu.fabric_clique and gpu.healthy:
                domains.setdefault(gpu.fabric_clique, []).append(GpuRef(node.name, gpu.index))
    for members in domains.values():
        if len({m.node for m in members}) < 2:
            continue  # a one-node "domain" is already described by its links
        for ra, rb in combinations(members, 2):
            adj[ra].add(rb)
            adj[rb].add(ra)
    return adj


def _components(adj: Mapping[GpuRef, set[GpuRef]]) -> list[list[GpuRef]]:
    seen: set[GpuRef] = set()
    out: list[list[GpuRef]] = []
    for start in sorted(adj):
        if start in seen:
            continue
        stack, comp = [start], []
        seen.add(start)
        while stack:
            cur = stack.pop()
            comp.append(cur)
            for nxt in adj[cur]:
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        out.append(sorted(comp))
    return out


def _pair_stats(topology: Topology, a: GpuRef, b: GpuRef) -> tuple[LinkKind | None, float]:
    if a.node == b.node:
        link = topology.node(a.node).link(a.index, b.index)
        if link is None or not link.joins_island:
            return None, 0.0
        return link.kind, link.effective_bandwidth_gb_s
    bw = min(fabric_clique_bandwidth_gb_s(topology, a), fabric_clique_bandwidth_gb_s(topology, b))
    return LinkKind.NVSWITCH, bw


def _island(topology: Topology, members: list[GpuRef], adj: Adjacency, ident: str) -> Island:
    best: LinkKind | None = None
    bottleneck = float("inf")
    full = True
    for a, b in combinations(members, 2):
        if b not in adj[a]:
            full = False
            continue
        kind, bw = _pair_stats(topology, a, b)
        if kind is not None:
            best = kind if best is None else max(best, kind)
            bottleneck = min(bottleneck, bw)
    if len(members) == 1:
        bottleneck = 0.0
    return Island(
        id=ident,
        gpus=tuple(members),
        kind=best,
        fully_connected=full,
        bottleneck_gb_s=bottleneck if bottleneck != float("inf") else 0.0,
    )


_NODE_CACHE: OrderedDict[int, tuple[Node, list[Island]]] = OrderedDict()
_NODE_CACHE_SIZE = 16384


def _node_islands(node: Node) -> list[Island]:
    """One node's islands from its own links; cached by node object (nodes are immutable and a
    re-plan's topology shares them with the previous one)."""
    hit = _NODE_CACHE.get(id(node))
    if hit is not None and hit[0] is node:
        _NODE_CACHE.move_to_end(id(node))
        return hit[1]
    alone = Topology(nodes=(node,))
    adj = adjacency(alone)
    found = [_island(alone, comp, adj, f"{node.name}/island{k}") for k, comp in enumerate(_components(adj))]
    _NODE_CACHE[id(node)] = (node, found)
    if len(_NODE_CACHE) > _NODE_CACHE_SIZE:
        _NODE_CACHE.popitem(last=False)
    return found


def islands(topology: Topology) -> list[Island]:
    """All islands, singletons included, sorted by (node, first GPU)."""
    per_node = [isl for node in topology.nodes for isl in _node_islands(node)]
    domains: dict[str, set[str]] = {}
    for node in topology.nodes:
        for gpu in node.gpus:
            if gpu.fabric_clique and gpu.healthy:
                domains.setdefault(gpu.fabric_clique, set()).add(node.name)
    spanning = {c: nodes for c, nodes in domains.items() if len(nodes) > 1}
    if not spanning:
        return sorted(per_node, key=lambda i: i.gpus[0])
    involved = {n for nodes in spanning.values() for n in nodes}
    result = [isl for isl in per_node if isl.gpus[0].node not in involved]
    sub = Topology(nodes=tuple(n for n in topology.nodes if n.name in involved), fabric=topology.fabric)
    adj = adjacency(sub)
    per_sub_node: dict[str, int] = {}
    for comp in _components(adj):
        nodes = sorted({g.node for g in comp})
        if len(nodes) == 1:
            k = per_sub_node.get(nodes[0], 0)
            per_sub_node[nodes[0]] = k + 1
            ident = f"{nodes[0]}/island{k}"
        else:
            ident = f"nvl:{sub.gpu(comp[0]).fabric_clique or 'multi'}"
        result.append(_island(sub, comp, adj, ident))
    return sorted(result, key=lambda i: i.gpus[0])


def island_of(islands_: Iterable[Island]) -> dict[GpuRef, Island]:
    return {g: isl for isl in islands_ for g in isl.gpus}


def maximal_cliques(adj: Mapping[GpuRef, set[GpuRef]]) -> list[list[GpuRef]]:
    """All maximal cliques of size >= 2 (Bron-Kerbosch with pivoting), each sorted."""
    out: list[list[GpuRef]] = []

    def expand(r: list[GpuRef], p: set[GpuRef], x: set[GpuRef]) -> None:
        if not p and not x:
            if len(r) >= 2:
                out.append(sorted(r))
            return
        pivot = max(p | x, key=lambda u: len(adj[u] & p))
        for v in sorted(p - adj[pivot]):
            expand([*r, v], p & adj[v], x & adj[v])
            p = p - {v}
            x = x | {v}

    for comp in _components(adj):
        if len(comp) >= 2:
            expand([], set(comp), set())
    return sorted(out)


def cliques(topology: Topology) -> list[list[GpuRef]]:
    return maximal_cliques(adjacency(topology))


def joined(topology: Topology, a: GpuRef, b: GpuRef) -> bool:
    """True when two GPUs are joined directly by healthy NVLink/NVSwitch/XGMI."""
    ga, gb = topology.gpu(a), topology.gpu(b)
    if not (ga.healthy and gb.healthy):
        return False
    if a.node != b.node:
        return ga.fabric_clique is not None and ga.fabric_clique == gb.fabric_clique
    link = topology.node(a.node).link(a.index, b.index)
    return link is not None and link.joins_island


def is_clique(topology: Topology, gpus: Sequence[GpuRef]) -> bool:
    """True when every pair of the group is joined by a healthy GPU-fabric link."""
    return all(joined(topology, a, b) for a, b in combinations(gpus, 2))
