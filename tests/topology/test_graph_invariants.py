"""Invariants of the physical graph on generated topologies: islands partition the GPUs, cliques
are all the maximal ones, and the fingerprint ignores order but not a changed link."""

from __future__ import annotations

import random
from dataclasses import replace
from itertools import combinations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from topology.islands import adjacency, cliques, islands, joined
from topology.kinds import LinkKind
from topology.model import Gpu, GpuRef, Link, LinkHealth, Node, Topology

pytestmark = pytest.mark.unit

KINDS = [LinkKind.NVLINK, LinkKind.NVSWITCH, LinkKind.XGMI, LinkKind.PIX, LinkKind.NODE, LinkKind.SYS]


@st.composite
def nodes(draw: st.DrawFn, name: str = "n0") -> Node:
    n = draw(st.integers(min_value=1, max_value=9))
    links = []
    for a, b in combinations(range(n), 2):
        kind = draw(st.sampled_from(KINDS))
        lanes = draw(st.integers(1, 18)) if kind in (LinkKind.NVLINK, LinkKind.NVSWITCH) else None
        healthy = draw(st.booleans()) if kind.is_gpu_fabric else True
        health = LinkHealth() if healthy else LinkHealth(score=0.1, healthy=False, reasons=("test",))
        links.append(Link(a=a, b=b, kind=kind, lanes=lanes, health=health))
    gpus = tuple(Gpu(index=i, numa_node=draw(st.sampled_from([0, 1, None]))) for i in range(n))
    return Node(name=name, gpus=gpus, links=tuple(links))


@st.composite
def topologies(draw: st.DrawFn) -> Topology:
    count = draw(st.integers(1, 3))
    return Topology(nodes=tuple(draw(nodes(name=f"n{i}")) for i in range(count)))


@given(topologies())
def test_islands_partition_the_gpus(topology: Topology) -> None:
    found = islands(topology)
    members = [g for i in found for g in i.gpus]
    assert sorted(members) == sorted(topology.gpu_refs())
    assert len(members) == len(set(members))
    where = {g: k for k, i in enumerate(found) for g in i.gpus}
    for a, b in combinations(topology.gpu_refs(), 2):
        if joined(topology, a, b):
            assert where[a] == where[b], "joined GPUs in different islands"


@given(topologies())
def test_cliques_are_maximal_cliques_and_all_of_them(topology: Topology) -> None:
    adj = adjacency(topology)
    found = {tuple(c) for c in cliques(topology)}
    for c in found:
        assert len(c) >= 2
        assert all(b in adj[a] for a, b in combinations(c, 2)), "not a clique"
        outside = set(topology.gpu_refs()) - set(c)
        assert not any(all(g in adj[m] for m in c) for g in outside), "not maximal"
    for node in topology.nodes:  # brute force on each node's small graph
        refs = [GpuRef(node.name, g.index) for g in node.gpus]
        for size in range(2, len(refs) + 1):
            for group in combinations(refs, size):
                if all(b in adj[a] for a, b in combinations(group, 2)):
                    assert any(set(group) <= set(c) for c in found), f"{group} not inside any clique"


@given(topologies(), st.randoms(use_true_random=False))
def test_fingerprint_ignores_order(topology: Topology, rnd: random.Random) -> None:
    shuffled_nodes = []
    for node in topology.nodes:
        links, gpus = list(node.links), list(node.gpus)
        rnd.shuffle(links)
        rnd.shuffle(gpus)
        shuffled_nodes.append(replace(node, links=tuple(links), gpus=tuple(gpus)))
    rnd.shuffle(shuffled_nodes)
    assert replace(topology, nodes=tuple(shuffled_nodes)).fingerprint() == topology.fingerprint()


@given(topologies(), st.data())
def test_fingerprint_changes_when_a_link_changes(topology: Topology, data: st.DataObject) -> None:
    candidates = [(n, k) for n in topology.nodes for k in n.links]
    if not candidates:
        return
    node, link = data.draw(st.sampled_from(candidates))
    other = data.draw(st.sampled_from([k for k in KINDS if k != link.kind]))
    lanes = 4 if other in (LinkKind.NVLINK, LinkKind.NVSWITCH) else None
    changed = replace(link, kind=other, lanes=lanes, bandwidth_gb_s=0.0)
    new_node = replace(node, links=tuple(changed if k is link else k for k in node.links))
    new = replace(topology, nodes=tuple(new_node if n is node else n for n in topology.nodes))
    assert new.fingerprint() != topology.fingerprint()
