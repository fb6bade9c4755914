"""Benchmark results (pure): a record of measurements with the fingerprint of what they were
taken on (the node's own topology, `node_fingerprint`; for a record between two nodes, the
pair's, `pair_fingerprint`), written as JSON; `apply` puts measured values into the topology (so
the cost model, which reads link bandwidth and latency, uses them in place of the kinds'
defaults), `with_measurements` does so for every record that still matches, and `regressions`
says where measured bandwidth fell below a baseline record.

A p2p measurement of a pair sets that pair's link and every other link of the same kind and
lane count on the node (one representative pair per tier); between two nodes it sets their
fabric path (`Fabric.measured`). An all-reduce is reported as bus bandwidth (nccl-tests' busbw:
2(n-1)/n x bytes / time), comparable across group sizes.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topology.bench.plan import Probe, link_label
from topology.diff import Change
from topology.errors import TopologyError
from topology.model import Link, MeasuredPath, Node, Topology

RECORD_KIND = "isleserve.topology-bench/v1"
REGRESSION_DROP = 0.10
"""Measured bandwidth more than this share below the baseline is reported as worse."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    probe: Probe
    size_bytes: int
    bandwidth_gb_s: float
    """p2p: one direction; allreduce: bus bandwidth."""
    latency_us: float
    """Small-message time (p2p: one way; allreduce: the whole collective)."""
    iters: int

    def to_json(self) -> dict[str, Any]:
        p = self.probe
        peer = {"peer": p.peer} if p.peer is not None else {}
        return {"kind": p.kind, "node": p.node, **peer, "gpus": list(p.gpus), "link": p.link, "tier": p.tier,
                "size_bytes": self.size_bytes, "bandwidth_gb_s": round(self.bandwidth_gb_s, 4),
                "latency_us": round(self.latency_us, 3), "iters": self.iters}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Measurement:
        peer = raw.get("peer")
        probe = Probe(kind=raw["kind"], node=str(raw["node"]), gpus=tuple(int(g) for g in raw["gpus"]),
                      link=str(raw["link"]), tier=str(raw["tier"]), peer=str(peer) if peer is not None else None)
        return cls(probe=probe, size_bytes=int(raw["size_bytes"]), bandwidth_gb_s=float(raw["bandwidth_gb_s"]),
                   latency_us=float(raw["latency_us"]), iters=int(raw["iters"]))


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchRecord:
    fingerprint: str
    source: str
    node: str
    backend: str
    """nccl on GPUs; gloo on loopback (ranks stand in for GPUs: the path is exercised, the
    numbers are the host's, not the GPUs')."""
    device: str
    started_at: str
    measurements: tuple[Measurement, ...]
    peer: str | None = None
    """A record between two nodes: the second one (the fingerprint is then the pair's)."""

    @property
    def subject(self) -> str:
        """What was measured: a node, or `a+b` between two nodes."""
        return self.node if self.peer is None else f"{self.node}+{self.peer}"

    def to_json(self) -> dict[str, Any]:
        peer = {"peer": self.peer} if self.peer is not None else {}
        return {"kind": RECORD_KIND, "fingerprint": self.fingerprint, "source": self.source, "node": self.node,
                **peer, "backend": self.backend, "device": self.device, "started_at": self.started_at,
                "measurements": [m.to_json() for m in self.measurements]}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> BenchRecord:
        peer = raw.get("peer")
        return cls(fingerprint=str(raw["fingerprint"]), source=str(raw["source"]), node=str(raw["node"]),
                   backend=str(raw["backend"]), device=str(raw["device"]), started_at=str(raw["started_at"]),
                   measurements=tuple(Measurement.from_json(m) for m in raw["measurements"]),
                   peer=str(peer) if peer is not None else None)


def node_fingerprint(topology: Topology, node: str) -> str:
    """The fingerprint of one node's own topology (the `isle.io/topology` label's, in full): it
    changes when that node changes (a link marked, a GPU lost), not when another node does."""
    return Topology(nodes=(topology.node(node),)).fingerprint()


def pair_fingerprint(topology: Topology, a: str, b: str) -> str:
    return Topology(nodes=(topology.node(a), topology.node(b)), fabric=topology.fabric).fingerprint()


def is_record(path: str) -> bool:
    """A bench record file (JSON naming RECORD_KIND), as opposed to a topology source."""
    try:
        with open(path, encoding="utf-8") as f:
            head = f.read(200)
    except (OSError, UnicodeDecodeError):
        return False
    return head.lstrip().startswith("{") and RECORD_KIND in head


def load(path: str) -> BenchRecord:
    try:
        raw = json.loads(Path(path).read_text())
        if raw.get("kind") != RECORD_KIND:
            raise TopologyError(f"{path}: not a bench record (kind {raw.get('kind')!r}, want {RECORD_KIND})")
        return BenchRecord.from_json(raw)
    except OSError as err:
        raise TopologyError(f"{path}: cannot read bench record: {err.strerror}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise TopologyError(f"{path}: malformed bench record ({err})") from None


def save(record: BenchRecord, path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(record.to_json(), indent=2) + "\n")


def _measured_link(link: Link, by_label: dict[str, Measurement]) -> Link:
    m = by_label.get(link_label(link.kind.label, link.lanes))
    if m is None or m.bandwidth_gb_s <= 0:
        return link
    return dataclasses.replace(link, bandwidth_gb_s=m.bandwidth_gb_s, latency_us=max(m.latency_us, 1e-3))


def _measured_node(node: Node, by_label: dict[str, Measurement]) -> Node:
    return dataclasses.replace(node, links=tuple(_measured_link(lk, by_label) for lk in node.links))


def matches(topology: Topology, record: BenchRecord) -> bool:
    """The record was taken on what the topology has now (its node, or its pair of nodes)."""
    names = (record.node,) if record.peer is None else (record.node, record.peer)
    if not all(topology.has_node(n) for n in names):
        return False
    now = node_fingerprint(topology, record.node) if record.peer is None else \
        pair_fingerprint(topology, record.node, record.peer)
    return record.fingerprint == now


def apply(topology: Topology, record: BenchRecord) -> Topology:
    """The topology with the record's p2p measurements as its links' bandwidth and latency (a
    record between two nodes: as their fabric path's)."""
    if not matches(topology, record):
        raise TopologyError(f"bench record of {record.subject} (topology {record.fingerprint}) does not match "
                            f"this topology: measure again")
    p2p = [m for m in record.measurements if m.probe.kind == "p2p"]
    if record.peer is not None:
        if not p2p or p2p[0].bandwidth_gb_s <= 0:
            return topology
        lo, hi = sorted((record.node, record.peer))
        fabric = topology.fabric
        others = tuple(m for m in fabric.measured if (m.a, m.b) != (lo, hi))
        path = MeasuredPath(a=lo, b=hi, bandwidth_gb_s=p2p[0].bandwidth_gb_s, latency_us=max(p2p[0].latency_us, 1e-3))
        return dataclasses.replace(topology, fabric=dataclasses.replace(fabric, measured=(*others, path)))
    by_label = {m.probe.link: m for m in p2p}
    nodes = tuple(_measured_node(n, by_label) if n.name == record.node else n for n in topology.nodes)
    return dataclasses.replace(topology, nodes=nodes)


def with_measurements(topology: Topology, records: Iterable[BenchRecord]) -> Topology:
    """The topology with every record applied that still matches it (the others are stale: what
    they measured has changed since)."""
    for record in records:
        if matches(topology, record):
            topology = apply(topology, record)
    return topology


def regressions(baseline: BenchRecord, current: BenchRecord, drop: float = REGRESSION_DROP) -> list[Change]:
    """Measurements whose bandwidth fell (or rose) by more than `drop` against the baseline."""
    old = {m.probe.name: m for m in baseline.measurements}
    out: list[Change] = []
    for m in current.measurements:
        before = old.get(m.probe.name)
        if before is None or before.bandwidth_gb_s <= 0:
            continue
        change = (m.bandwidth_gb_s - before.bandwidth_gb_s) / before.bandwidth_gb_s
        if abs(change) > drop:
            gpus = m.probe.name.split(" ", 1)[1] if m.probe.peer else '-'.join(f'GPU{g}' for g in m.probe.gpus)
            subject = f"{m.probe.kind} {gpus} ({m.probe.link})"
            out.append(Change(node=m.probe.node, subject=subject, worse=change < 0,
                              what=f"measured {before.bandwidth_gb_s:.3g} -> {m.bandwidth_gb_s:.3g} GB/s "
                                   f"({change:+.0%})"))
    for name in sorted(set(old) - {m.probe.name for m in current.measurements}):
        out.append(Change(node=old[name].probe.node, subject=name, what="no longer measured", worse=True))
    return out
