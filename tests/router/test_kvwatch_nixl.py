"""The router's reading of a decode's NIXL counters (router.kvwatch) where real vLLM 0.32 differs
from a steady stream of transfers: PD requests come one at a time, so most scrape windows move
nothing, and vLLM counts a transfer when it completes, before the router has seen the request's
end (the figures are the vLLM tier's: ~0.6 MB per transfer, ~3 ms each, tests/vllm/test_vllm_kv_path.py)."""

from __future__ import annotations

import pytest

from router.kvwatch import KvWatch, NixlTotals
from router.plugins.kvpath import KvPathRules

pytestmark = pytest.mark.unit

RULES = KvPathRules(window_s=0.0, noise_ms=0.0)
NVLINK_NV2 = 1e-6 / 40.0
"""ms per byte of the vLLM tier's declared path (configs/clusters/cpu-pair.yaml: NV2, 40 GB/s)."""
PAIR = ("p1", "d1")


def totals(transfers: float, xfer_seconds: float, kv_bytes: float, failed: float = 0.0) -> NixlTotals:
    return NixlTotals(xfer_seconds=xfer_seconds, kv_bytes=kv_bytes, transfers=transfers, failed=failed)


def handover(watch: KvWatch, now: float) -> None:
    watch.handover(PAIR, tier="nvlink", expected_ms_per_byte=NVLINK_NV2, kv_bytes=1e8, transfer_ms=None, now=now)


def test_a_window_without_transfers_keeps_the_decodes_last_bandwidth() -> None:
    """One request, then the scrapes of an idle decode: its NIXL gauge stays at the transfer's
    0.2 GB/s (it read 0 from the next scrape on, so between sparse PD requests, always)."""
    watch = KvWatch(RULES)
    watch.scraped("d1", totals(0, 0.0, 0), 0.0)
    handover(watch, 0.4)
    watch.scraped("d1", totals(1, 0.003, 6.0e5), 0.5)
    assert watch.view(0.5)["decodes"]["d1"]["nixl_bandwidth_gb_s"] == 0.2
    for t in (1.0, 1.5, 2.0):
        watch.scraped("d1", totals(1, 0.003, 6.0e5), t)
    assert watch.view(2.0)["decodes"]["d1"] == {"nixl_bandwidth_gb_s": 0.2, "nixl_failed_transfers": 0.0}


def test_a_transfer_counted_before_its_handover_judges_the_pair_at_the_next_scrape() -> None:
    """A scrape lands after vLLM counted the transfer and before the decode's answer ended (when
    the router records the handover): the window's 0.6 MB in 3 ms judge p1->d1 at the next
    scrape (it judged nothing: the next window moved nothing). 0.2 GB/s on a 40 GB/s path."""
    watch = KvWatch(RULES)
    watch.scraped("d1", totals(0, 0.0, 0), 0.0)
    watch.scraped("d1", totals(1, 0.003, 6.0e5), 0.5)  # counted; the answer still streams
    handover(watch, 0.6)
    watch.scraped("d1", totals(1, 0.003, 6.0e5), 1.0)
    (row,) = watch.view(1.0)["pairs"]
    assert (row["pair"], row["samples"], row["measured_gb_s"], row["verdict"]) == ("p1->d1", 1, 0.2, "slow")


def test_failures_before_the_handover_count_against_the_pair_that_fed_it() -> None:
    watch = KvWatch(RULES)
    watch.scraped("d1", totals(0, 0.0, 0), 0.0)
    watch.scraped("d1", totals(0, 0.0, 0, failed=1), 0.5)
    handover(watch, 0.6)
    watch.scraped("d1", totals(0, 0.0, 0, failed=1), 1.0)
    (row,) = watch.view(1.0)["pairs"]
    assert row["verdict"] == "failing"
