"""The controller's communication benchmarks: runs what `measure.due` says on the backend (Ray
tasks pinned to each node, then node pairs), records each result (a `bench` event with the
fingerprint it was measured on, the record file `<state_dir>/bench/<subject>-<fingerprint>.json`
that `python -m topology diff` reads, and, for the first record of a fingerprint, its baseline
`...baseline.json`), reports bandwidth that fell more than 10 % below that baseline (a
`bench_regression` event, a warning, and `status()`), and applies every record that still
matches to the topology: the links' and node pairs' measured bandwidth and latency replace the
defaults in the cost model that placement and the router's PD scorer read.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from control.backend import Backend
from control.benches.schedule import BenchPolicy, Measured, Subject, due, subjects
from control.nodecheck import RayNode
from control.state.alarms import Alarms
from control.state.files import StateFiles
from control.state.saved import SavedBench
from topology import Topology
from topology.bench.record import BenchRecord, load, regressions, with_measurements
from topology.bench.run import BenchSettings
from topology.errors import TopologyError

log = logging.getLogger("isleserve.controller")


class BenchKeeper:
    def __init__(self, policy: BenchPolicy, files: StateFiles, record: Callable[[str, dict[str, Any]], None],
                 clock: Callable[[], float], alarms: Alarms | None = None) -> None:
        self.policy, self.files, self.record, self.clock = policy, files, record, clock
        self.alarms = alarms if alarms is not None else Alarms()
        self.dir = Path(files.directory) / "bench"
        self.records: dict[str, BenchRecord] = {}
        self.last: dict[str, Measured] = {}
        self.below: dict[str, list[str]] = {}
        """Subject -> what its latest run measured below its baseline."""

    def measured(self, topology: Topology) -> Topology:
        """The topology with every record that still matches it applied."""
        return with_measurements(topology, self.records.values())

    def settings(self, simulated: bool) -> BenchSettings:
        """gloo on loopback for simulated nodes (the path, not the numbers), NCCL on real GPUs."""
        return BenchSettings(backend="gloo" if simulated else "nccl", size_bytes=self.policy.size_bytes,
                             iters=self.policy.iters, timeout_s=self.policy.timeout_s)

    def run_due(self, backend: Backend, topology: Topology, bindings: Mapping[str, RayNode], *, everywhere: bool,
                simulated: bool, source: str) -> bool:
        """Bench what is due; True when a new record was taken (the topology should be re-applied)."""
        todo = due(self.policy, self.clock(), subjects(topology, bindings, everywhere), self.last)
        if not todo:
            return False
        try:
            results = backend.bench(topology, [s for s, _ in todo], self.settings(simulated), source)
        except Exception as err:  # a bench must never fail a deploy or stop the health loop
            results = {s.key: f"bench failed: {err}" for s, _ in todo}
        now, taken = self.clock(), False
        for s, reason in todo:
            got = results.get(s.key, "no result")
            if isinstance(got, str):
                self.last[s.key] = Measured(fingerprint=s.fingerprint, ray_ids=s.ray_ids, at=now, ok=False)
                log.warning("bench %s (%s) failed: %s", s.key, reason, got)
                self.record("bench_failed", {"subject": s.key, "reason": reason, "error": got[-800:]})
                continue
            self.last[s.key] = Measured(fingerprint=s.fingerprint, ray_ids=s.ray_ids, at=now)
            self._keep(s, reason, got)
            taken = True
        return taken

    def _paths(self, record: BenchRecord) -> tuple[Path, Path]:
        stem = f"{record.subject}-{record.fingerprint}"
        return self.dir / f"{stem}.json", self.dir / f"{stem}.baseline.json"

    def _keep(self, s: Subject, reason: str, record: BenchRecord) -> None:
        latest, baseline = self._paths(record)
        self.records[s.key] = record  # used from memory even when its file cannot be written
        data = (json.dumps(record.to_json(), indent=2) + "\n").encode()
        try:
            self.files.replace(f"bench/{latest.name}", data)
            if self.files.read(f"bench/{baseline.name}") is None:
                self.files.replace(f"bench/{baseline.name}", data)
        except OSError as err:
            self.alarms.failed("bench_record", err)
            log.error("bench %s: record not kept: %s", s.key, err)
            self.record("bench_record_failed", {"subject": s.key, "error": str(err)})
            return
        self.alarms.cleared("bench_record")
        self.record("bench", {
            "subject": s.key, "nodes": list(s.nodes), "reason": reason, "bench_fingerprint": record.fingerprint,
            "backend": record.backend, "record": str(latest), "baseline": str(baseline),
            "measurements": [{"probe": m.probe.name, "link": m.probe.link, "tier": m.probe.tier,
                              "bandwidth_gb_s": round(m.bandwidth_gb_s, 4), "latency_us": round(m.latency_us, 3)}
                             for m in record.measurements]})
        worse = [f"{c.subject}: {c.what}" for c in regressions(load(str(baseline)), record) if c.worse]
        self.below[s.key] = worse
        if worse:
            log.warning("bench %s below its baseline: %s", s.key, "; ".join(worse))
            self.record("bench_regression", {"subject": s.key, "baseline": str(baseline), "record": str(latest),
                                             "below_baseline": worse})

    def forget(self, nodes: set[str]) -> None:
        """Nodes that left: whatever measured them (pairs included) is measured afresh when they return."""
        for key in [k for k in self.last if set(k.split("+")) & nodes]:
            self.last.pop(key, None)
            self.records.pop(key, None)
            self.below.pop(key, None)

    # state ----------------------------------------------------------------------------------
    def saved(self) -> dict[str, SavedBench]:
        out = {}
        for key, m in self.last.items():
            record = self.records.get(key)
            path = str(self._paths(record)[0]) if record is not None and m.ok else None
            out[key] = SavedBench(fingerprint=m.fingerprint, ray_ids=m.ray_ids, ok=m.ok, record=path)
        return out

    def restore(self, saved: Mapping[str, SavedBench]) -> None:
        """A restarted controller's view: the saved records (the schedule restarts from now)."""
        now = self.clock()
        for key, b in saved.items():
            self.last[key] = Measured(fingerprint=b.fingerprint, ray_ids=b.ray_ids, at=now, ok=b.ok)
            if b.record is not None:
                try:
                    self.records[key] = load(b.record)
                except TopologyError as err:
                    log.warning("bench record of %s not restored: %s", key, err)

    def status(self) -> dict[str, Any]:
        return {key: {"fingerprint": r.fingerprint, "backend": r.backend, "started_at": r.started_at,
                      "record": str(self._paths(r)[0]), "baseline": str(self._paths(r)[1]),
                      "below_baseline": self.below.get(key, [])} for key, r in sorted(self.records.items())}
