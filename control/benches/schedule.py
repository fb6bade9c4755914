"""When the controller benchmarks what (pure): the topology bench (`topology.bench`) of every node
and, between nodes, of a ring of node pairs (each node with the next by name, so n nodes cost n
runs, not n^2), at deploy and again when what was measured changed or on a schedule.

A subject (a node, or a pair `a+b`) is due when
- it was never measured (first deploy, a node that joined);
- its topology fingerprint changed since (a link marked or unmarked, counters that took a link
  out, a GPU lost: maintenance and faults);
- the Ray node under it changed (a node replaced, or lost and back: Ray gives a returning node a
  new id);
- or `interval_s` passed since its last run.
The first two triggers belong to `on_change`; a failed run is retried on the next trigger, not
on every pass of the health loop.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from control.nodecheck import RayNode
from topology import Topology
from topology.bench.record import node_fingerprint, pair_fingerprint


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchPolicy:
    on_change: bool = False
    """Bench at deploy and after every topology change."""
    interval_s: float = 0.0
    """And again this often (0: not on a schedule)."""
    size_bytes: int | None = None
    """Message size (None: the bench's default for its backend)."""
    iters: int | None = None
    timeout_s: float = 300.0

    @property
    def enabled(self) -> bool:
        return self.on_change or self.interval_s > 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Subject:
    key: str
    """A node's name, or `a+b` for the pair of nodes a and b."""
    nodes: tuple[str, ...]
    fingerprint: str
    ray_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Measured:
    """A subject's last run."""

    fingerprint: str
    ray_ids: tuple[str, ...]
    at: float
    """On the controller's clock."""
    ok: bool = True


def pair_key(a: str, b: str) -> str:
    return f"{a}+{b}"


def subjects(topology: Topology, bindings: Mapping[str, RayNode], everywhere: bool = False) -> list[Subject]:
    """Every node a bench can run on (one a Ray node carries; with `everywhere`, all: a local
    backend runs them all on this host), then the ring of pairs between them."""
    names = sorted(n.name for n in topology.nodes if everywhere or n.name in bindings)
    ray = {n: (bindings[n].node_id,) if n in bindings else () for n in names}
    out = [Subject(key=n, nodes=(n,), fingerprint=node_fingerprint(topology, n), ray_ids=ray[n]) for n in names]
    pairs = list(itertools.pairwise(names))
    if len(names) > 2:
        pairs.append((names[-1], names[0]))
    for a, b in pairs:
        lo, hi = sorted((a, b))
        out.append(Subject(key=pair_key(lo, hi), nodes=(lo, hi), fingerprint=pair_fingerprint(topology, lo, hi),
                           ray_ids=(*ray[lo], *ray[hi])))
    return out


def due(policy: BenchPolicy, now: float, candidates: Sequence[Subject], last: Mapping[str, Measured]
        ) -> list[tuple[Subject, str]]:
    """The subjects to bench now, each with the reason."""
    if not policy.enabled:
        return []
    out = []
    for s in candidates:
        m = last.get(s.key)
        if m is None:
            out.append((s, "first measurement"))
        elif policy.on_change and m.fingerprint != s.fingerprint:
            out.append((s, f"topology changed ({m.fingerprint} -> {s.fingerprint})"))
        elif policy.on_change and m.ray_ids != s.ray_ids:
            out.append((s, "Ray node replaced or back"))
        elif policy.interval_s > 0 and now - m.at >= policy.interval_s:
            out.append((s, f"scheduled (every {policy.interval_s:g} s)"))
    return out
