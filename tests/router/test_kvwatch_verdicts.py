"""The router's KV-path verdicts as the controller gets them (router.kvwatch.KvWatch.verdicts,
the load report's `kv_paths`): the same verdicts and figures /admin/replicas shows; a replica
the controller re-places is judged afresh."""

from __future__ import annotations

import pytest

from pools.autoscale.report import LoadReport
from pools.routing import ReplicaEndpoint, RoutingTable
from router.kvwatch import KvWatch, NixlTotals
from router.plugins.kvpath import KvPathRules
from router.state import Replicas

pytestmark = pytest.mark.unit

GB = 1e-6  # ms per byte at 1 GB/s
RDMA, TCP = GB / 50.0, GB / 12.5


def test_verdicts_match_the_admin_view_and_cross_the_wire() -> None:
    watch = KvWatch(KvPathRules(window_s=10.0, noise_ms=0.0))
    for now in (0.0, 5.0, 11.0):  # TCP speed on an RDMA pair, held past the window
        watch.handover(("p0", "d0"), tier="rdma", expected_ms_per_byte=RDMA, kv_bytes=1e8, transfer_ms=TCP * 1e8,
                       now=now)
    watch.handover(("p0", "d1"), tier="rdma", expected_ms_per_byte=RDMA, kv_bytes=1e8, transfer_ms=RDMA * 1e8,
                   now=11.0)
    verdicts = watch.verdicts(11.0)
    view = watch.view(11.0)["pairs"]
    assert [(x.pair, x.verdict, x.measured_gb_s, x.expected_gb_s, x.samples, x.avoided) for x in verdicts] == [
        (p["pair"], p["verdict"], p["measured_gb_s"], p["expected_gb_s"], p["samples"], p["avoided"]) for p in view]
    assert [(x.pair, x.verdict, x.measured_gb_s) for x in verdicts] == [
        ("p0->d0", "wrong_path", 12.5), ("p0->d1", "as_planned", 50.0)]
    report = LoadReport(kv_paths=verdicts)
    assert LoadReport.from_json(report.to_json()).kv_paths == verdicts


def test_a_moved_replica_takes_its_pairs_evidence_with_it() -> None:
    def table(version: int, decode_gpus: tuple[int, ...]) -> RoutingTable:
        return RoutingTable(version=version, replicas=(
            ReplicaEndpoint(replica_id="p0", url="http://127.0.0.1:1", model="m", pool="prefill", role="prefill",
                            node="a", gpus=(0, 1)),
            ReplicaEndpoint(replica_id="d0", url="http://127.0.0.1:2", model="m", pool="decode", role="decode",
                            node="a", gpus=decode_gpus)))

    replicas = Replicas(table(1, (2, 3)), 3, 5.0, 0)
    replicas.kv_watch = watch = KvWatch(KvPathRules(window_s=0.0, noise_ms=0.0))
    watch.handover(("p0", "d0"), tier="rdma", expected_ms_per_byte=RDMA, kv_bytes=1e8, transfer_ms=TCP * 1e8, now=0.0)
    replicas.follow(table(2, (2, 3)))  # the same place: the evidence stays
    assert [x.verdict for x in watch.verdicts(1.0)] == ["wrong_path"]
    replicas.follow(table(3, (4, 5)))  # re-placed (`python -m pools replace`): judged afresh
    assert watch.verdicts(2.0) == () and watch.decodes == {}


def test_a_read_within_the_noise_allowance_is_judged_as_planned_but_shown_as_timed() -> None:
    """A 0.2 ms NIXL read of 0.8 MB on a 40 GB/s path moved at 4 GB/s: within `noise_ms` of its
    expectation it is judged as planned (the allowance covers vLLM's once-a-step completion
    check), but the pair shows what was timed, not 40 of 40 GB/s (the vLLM CPU tier's case)."""
    nvlink = GB / 40.0
    watch = KvWatch(KvPathRules(window_s=0.0, noise_ms=5.0))
    watch.scraped("d0", NixlTotals(xfer_seconds=0.0, kv_bytes=0.0, transfers=0.0, failed=0.0), 0.0)
    watch.handover(("p0", "d0"), tier="nvlink", expected_ms_per_byte=nvlink, kv_bytes=8e5, transfer_ms=None, now=0.5)
    watch.scraped("d0", NixlTotals(xfer_seconds=2e-4, kv_bytes=8e5, transfers=1.0, failed=0.0), 1.0)
    pair = watch.view(1.0)["pairs"][0]
    assert pair["verdict"] == "as_planned" and pair["samples"] == 1
    assert pair["measured_gb_s"] == 4.0 and pair["expected_gb_s"] == 40.0
