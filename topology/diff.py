"""Topology drift: what got worse and what got better between two readings of the same machines.

The check an operator runs after maintenance: links trained down (kind or lanes), link health
or bandwidth lost, GPUs or NICs missing, NICs farther from their GPUs, islands split. Exit 1
from the CLI when anything got worse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from topology.islands import islands
from topology.kinds import LinkKind, rank
from topology.model import GpuRef, Link, Node, Topology

BANDWIDTH_DROP = 0.10
"""A link whose effective bandwidth falls by more than this share is reported as worse."""
SCORE_DROP = 0.10


@dataclass(frozen=True, slots=True, kw_only=True)
class Change:
    node: str
    subject: str
    what: str
    worse: bool

    def as_json(self) -> dict[str, Any]:
        return {"node": self.node, "subject": self.subject, "what": self.what,
                "verdict": "worse" if self.worse else "better"}


def _lanes(link: Link) -> str:
    return f"{link.kind.label} NV{link.lanes}" if link.lanes else link.kind.label


def _family_rank(link: Link) -> tuple[int, int]:
    """NVLink through a switch or direct is one family: only lanes compare within it (one pair
    training down turns a board's NVSWITCH recognition off, which is not a change of its own)."""
    kind = LinkKind.NVLINK if link.kind is LinkKind.NVSWITCH else link.kind
    return rank(kind, link.lanes)


def _link_changes(node: str, a: int, b: int, old: Link, new: Link) -> list[Change]:
    subject = f"GPU{a}-GPU{b}"
    out: list[Change] = []
    before, after = _family_rank(old), _family_rank(new)
    if after != before:
        out.append(Change(node=node, subject=subject, what=f"{_lanes(old)} -> {_lanes(new)}", worse=after < before))
    if old.health.healthy != new.health.healthy:
        reasons = "; ".join(new.health.reasons) or "recovered"
        out.append(Change(node=node, subject=subject, worse=not new.health.healthy,
                          what=("unhealthy: " if not new.health.healthy else "healthy again: ") + reasons))
    elif new.health.score < old.health.score - SCORE_DROP:
        reasons = "; ".join(new.health.reasons)
        out.append(Change(node=node, subject=subject, worse=True,
                          what=f"health {old.health.score:g} -> {new.health.score:g}: {reasons}"))
    bw_old, bw_new = old.effective_bandwidth_gb_s, new.effective_bandwidth_gb_s
    if after == before and bw_old > 0 and abs(bw_new - bw_old) / bw_old > BANDWIDTH_DROP:
        out.append(Change(node=node, subject=subject, worse=bw_new < bw_old,
                          what=f"bandwidth {bw_old:.4g} -> {bw_new:.4g} GB/s"))
    return out


def _node_changes(old: Node, new: Node) -> list[Change]:
    out: list[Change] = []
    name = new.name
    old_gpus, new_gpus = {g.index: g for g in old.gpus}, {g.index: g for g in new.gpus}
    for i in sorted(old_gpus.keys() - new_gpus.keys()):
        out.append(Change(node=name, subject=f"GPU{i}", what="missing", worse=True))
    for i in sorted(new_gpus.keys() - old_gpus.keys()):
        out.append(Change(node=name, subject=f"GPU{i}", what="added", worse=False))
    for i in sorted(old_gpus.keys() & new_gpus.keys()):
        go, gn = old_gpus[i], new_gpus[i]
        if go.pci_bus_id and gn.pci_bus_id and go.pci_bus_id != gn.pci_bus_id:
            out.append(Change(node=name, subject=f"GPU{i}", worse=True,
                              what=f"PCI bus id {go.pci_bus_id} -> {gn.pci_bus_id} (GPU order changed)"))
        if go.healthy != gn.healthy:
            out.append(Change(node=name, subject=f"GPU{i}", worse=not gn.healthy,
                              what="unhealthy: " + "; ".join(gn.health_reasons) if not gn.healthy else "healthy again"))
    for link in old.links:
        other = new.link(link.a, link.b)
        if other is not None:
            out.extend(_link_changes(name, link.a, link.b, link, other))
    old_nics, new_nics = {n.name: n for n in old.nics}, {n.name: n for n in new.nics}
    for n in sorted(old_nics.keys() - new_nics.keys()):
        out.append(Change(node=name, subject=f"NIC {n}", what="missing", worse=True))
    for n in sorted(new_nics.keys() - old_nics.keys()):
        out.append(Change(node=name, subject=f"NIC {n}", what="added", worse=False))
    for n in sorted(old_nics.keys() & new_nics.keys()):
        no, nn = old_nics[n], new_nics[n]
        if nn.level != no.level:
            out.append(Change(node=name, subject=f"NIC {n}", worse=nn.level < no.level,
                              what=f"level to nearest GPUs {no.level.name} -> {nn.level.name}"))
        elif set(nn.nearest_gpus) != set(no.nearest_gpus):
            lost = not set(no.nearest_gpus) <= set(nn.nearest_gpus)
            out.append(Change(node=name, subject=f"NIC {n}", worse=lost,
                              what=f"nearest GPUs {sorted(no.nearest_gpus)} -> {sorted(nn.nearest_gpus)} "
                                   f"({nn.level.name})"))
        if no.speed_gbit_s and nn.speed_gbit_s and nn.speed_gbit_s != no.speed_gbit_s:
            out.append(Change(node=name, subject=f"NIC {n}", worse=nn.speed_gbit_s < no.speed_gbit_s,
                              what=f"speed {no.speed_gbit_s:g} -> {nn.speed_gbit_s:g} Gb/s"))
    return out


def _fmt(refs: set[GpuRef]) -> str:
    nodes = {r.node for r in refs}
    if len(nodes) == 1:
        return "{" + ",".join(str(r.index) for r in sorted(refs)) + "}"
    return "{" + ",".join(str(r) for r in sorted(refs)) + "}"


def _island_changes(old: Topology, new: Topology) -> list[Change]:
    out: list[Change] = []
    new_sets = [set(i.gpus) for i in islands(new)]
    old_sets = [set(i.gpus) for i in islands(old)]
    present = set(new.gpu_refs())
    for members in old_sets:
        alive = members & present
        parts = [s & alive for s in new_sets if s & alive]
        if len(parts) > 1:
            node = sorted(members)[0].node
            what = f"island {_fmt(members)} split into " + " ".join(_fmt(p) for p in parts)
            out.append(Change(node=node, subject="islands", what=what, worse=True))
    for members in new_sets:
        parts = [s & members for s in old_sets if s & members]
        if len(parts) > 1:
            node = sorted(members)[0].node
            out.append(Change(node=node, subject="islands", worse=False,
                              what="islands " + " ".join(_fmt(p) for p in parts) + f" joined into {_fmt(members)}"))
    return out


def diff(old: Topology, new: Topology) -> list[Change]:
    out: list[Change] = []
    old_names = {n.name for n in old.nodes}
    new_names = {n.name for n in new.nodes}
    for name in sorted(old_names - new_names):
        out.append(Change(node=name, subject="node", what="missing", worse=True))
    for name in sorted(new_names - old_names):
        out.append(Change(node=name, subject="node", what="added", worse=False))
    for name in sorted(old_names & new_names):
        out.extend(_node_changes(old.node(name), new.node(name)))
    out.extend(_island_changes(old, new))
    return out


def render(changes: list[Change]) -> str:
    if not changes:
        return "no changes\n"
    worse = [c for c in changes if c.worse]
    better = [c for c in changes if not c.worse]
    lines = [f"{len(worse)} worse, {len(better)} better"]
    lines += [f"WORSE   {c.node}  {c.subject}: {c.what}" for c in worse]
    lines += [f"better  {c.node}  {c.subject}: {c.what}" for c in better]
    return "\n".join(lines) + "\n"
