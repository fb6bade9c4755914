"""The router's measurements of KV handovers (issue 34), judged by `router.plugins.kvpath`:

- per PD request, the router's own view: the prefill leg's end to the decode's first token, less
  the decode's predicted first step (`router.plugins.ttft.decode_step_ms`), attributed to the
  (prefill, decode) pair (`isle_kv_transfer_seconds`). It carries HTTP and the decode's
  tokenizing (a cold 11k-token prompt: 58 ms more on the simulated engine), so it judges a pair
  only where the counters below cannot;
- per decode replica, its NIXL KV-connector counters as vLLM exports them
  (`vllm:nixl_xfer_time_seconds`, `vllm:nixl_bytes_transferred`, `vllm:nixl_num_failed_transfers`)
  between two scrapes: achieved bandwidth and failed transfers. vLLM's labels do not say which
  prefill a transfer came from, so a decode only one prefill feeds gives that pair its windows'
  bandwidth; failures count against every pair that fed it in the window. Where the engine also
  exports its transfers per prefill (`isle_engine_kv_transfer_*{remote_engine_id}`: the
  simulated engine; the id is the prefill's replica id under the controller), those judge each
  pair exactly.

It keeps state but does no I/O: the scraper and the PD flight hand it values and a clock time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pools.kvpaths import PairVerdict
from router.plugins import kvpath
from router.plugins.kvpath import KvPathRules, PairState
from wire.promtext import MetricsError, parse

NIXL = "vllm:nixl_"
PEER = "isle_engine_kv_transfer_"
PEER_SECONDS, PEER_BYTES, PEER_FAILED = PEER + "seconds", PEER + "bytes_total", PEER + "failures_total"
XFER_SECONDS, BYTES = "vllm:nixl_xfer_time_seconds", "vllm:nixl_bytes_transferred"
FAILED = "vllm:nixl_num_failed_transfers"
Pair = tuple[str, str]
"""(prefill replica id, decode replica id)."""


@dataclass(frozen=True, slots=True)
class PeerTotals:
    """A decode engine's whole handovers from one prefill engine (all ranks together)."""

    seconds: float
    handovers: float
    kv_bytes: float
    failed: float


@dataclass(frozen=True, slots=True)
class NixlTotals:
    """A decode engine's NIXL counters, summed over its engines (`engine` label)."""

    xfer_seconds: float
    kv_bytes: float
    transfers: float
    failed: float
    peers: Mapping[str, PeerTotals] = field(default_factory=dict)
    """Per prefill engine id, where the engine says (`PEER`)."""


def nixl_totals(text: str) -> NixlTotals | None:
    """The NIXL counters in an engine's /metrics text; None when it exports none (no NIXL
    connector, or a prefill engine). vLLM's counters carry `_total`; a histogram's `_sum`."""
    try:
        scrape = parse(text, names=(NIXL, PEER))
    except MetricsError:
        return None
    seconds = scrape.value(XFER_SECONDS + "_sum")
    if seconds is None:
        return None
    ids = {labels.get("remote_engine_id", "") for labels, _ in scrape.samples.get(PEER_SECONDS + "_count", ())}
    peers = {peer: PeerTotals(seconds=scrape.value(PEER_SECONDS + "_sum", remote_engine_id=peer) or 0.0,
                              handovers=scrape.value(PEER_SECONDS + "_count", remote_engine_id=peer) or 0.0,
                              kv_bytes=scrape.value(PEER_BYTES, remote_engine_id=peer) or 0.0,
                              failed=scrape.value(PEER_FAILED, remote_engine_id=peer) or 0.0)
             for peer in ids if peer}
    return NixlTotals(xfer_seconds=seconds, kv_bytes=scrape.value(BYTES + "_sum") or 0.0,
                      transfers=scrape.value(XFER_SECONDS + "_count") or 0.0,
                      failed=scrape.value(FAILED + "_total") or scrape.value(FAILED) or 0.0, peers=peers)


@dataclass(slots=True)
class DecodeNixl:
    """One decode replica's NIXL view: the last totals and the last window's rates."""

    last: NixlTotals | None = None
    bandwidth_gb_s: float = 0.0
    """Of the last window that moved KV: one without transfers (a decode between PD requests)
    says nothing of the path, and the gauge would read 0 most of the time under sparse traffic."""
    failed: float = 0.0
    """Failed transfers in the last window."""
    fed_by: set[str] = field(default_factory=set)
    """Prefill replicas whose handovers reached the decode since the last scrape."""
    judged: NixlTotals | None = None
    """The totals the pairs were last judged up to: vLLM counts a transfer when it completes,
    the router records the handover when the decode's answer ends, so a scrape between the two
    sees transfers that no handover explains yet; they wait for the next window, whose handovers
    do (`fed_by`)."""
    feeders: set[str] = field(default_factory=set)
    """Every prefill replica that fed it."""

    def attributes(self, prefill: str) -> bool:
        """Whether its counters judge `prefill`'s pair: per peer, or with one feeder only."""
        return self.last is not None and (bool(self.last.peers) or self.feeders == {prefill})


@dataclass(slots=True)
class PairEntry:
    state: PairState
    tier: str
    expected_ms_per_byte: float
    latency_ms: float = 0.0
    """The path's set-up latency per transfer (`kv_route`)."""
    decode_tp: int = 1
    """The decode's ranks: vLLM's NIXL counters record one transfer per rank, of its shard."""


class KvWatch:
    def __init__(self, rules: KvPathRules, max_pairs: int = 64) -> None:
        """`max_pairs`: pairs followed (and labelled in metrics); a pair past it is not."""
        self.rules, self.max_pairs = rules, max_pairs
        self.pairs: dict[Pair, PairEntry] = {}
        self.decodes: dict[str, DecodeNixl] = {}

    def handover(self, pair: Pair, *, tier: str, expected_ms_per_byte: float, kv_bytes: float,
                 transfer_ms: float | None, now: float, latency_ms: float = 0.0, decode_tp: int = 1) -> bool:
        """A PD request's handover as the router saw it (`transfer_ms` None: it went over the pair,
        untimed); False when the pair is not followed (past `max_pairs`)."""
        decode = self.decodes.setdefault(pair[1], DecodeNixl())
        decode.fed_by.add(pair[0])
        decode.feeders.add(pair[0])
        entry = self.pairs.get(pair)
        if entry is None:
            if len(self.pairs) >= self.max_pairs:
                return False
            entry = self.pairs[pair] = PairEntry(PairState(), tier, expected_ms_per_byte)
        entry.tier, entry.expected_ms_per_byte = tier, expected_ms_per_byte
        entry.latency_ms, entry.decode_tp = latency_ms, max(1, decode_tp)
        if transfer_ms is None or decode.attributes(pair[0]):
            return True  # the engine's counters judge the pair, not the router's clock
        measured = kvpath.measured_ms_per_byte(expected_ms_per_byte, latency_ms, kv_bytes, transfer_ms, self.rules)
        entry.state = kvpath.observe(entry.state, now=now, expected_ms_per_byte=expected_ms_per_byte,
                                     observed_ms_per_byte=measured, failed=0, rules=self.rules,
                                     seen_ms_per_byte=kvpath.seen_ms_per_byte(latency_ms, kv_bytes, transfer_ms))
        return True

    def scraped(self, decode_id: str, totals: NixlTotals | None, now: float) -> None:
        """A scrape of a decode replica's NIXL counters; a window's failures judge the pairs that
        fed it, its bandwidth the one pair that did when only one did."""
        if totals is None:
            return
        d = self.decodes.setdefault(decode_id, DecodeNixl())
        last, d.last = d.last, totals
        fed, d.fed_by = d.fed_by, set()
        if last is None or totals.xfer_seconds < last.xfer_seconds:  # first scrape, or the engine restarted
            d.judged = totals
            return
        seconds, moved = totals.xfer_seconds - last.xfer_seconds, totals.kv_bytes - last.kv_bytes
        d.failed = max(0.0, totals.failed - last.failed)
        if seconds > 0 and moved > 0:
            d.bandwidth_gb_s = moved / seconds / 1e9
        if totals.peers:
            self._peers(decode_id, totals, last, now)
            d.judged = totals
            return
        base = d.judged or last
        if not fed and (totals.transfers > base.transfers or totals.failed > base.failed):
            return  # transfers whose handovers the router has not recorded yet (`DecodeNixl.judged`)
        d.judged = totals
        self._judge(decode_id, fed, totals, base, now)

    def _judge(self, decode_id: str, fed: set[str], totals: NixlTotals, base: NixlTotals, now: float) -> None:
        """The transfers since `base` judge the pairs that `fed` the decode: their failures each,
        their bandwidth the one pair when only one did."""
        seconds, moved = totals.xfer_seconds - base.xfer_seconds, totals.kv_bytes - base.kv_bytes
        transfers, failed = totals.transfers - base.transfers, max(0.0, totals.failed - base.failed)
        for prefill in fed:
            entry = self.pairs.get((prefill, decode_id))
            if entry is None:
                continue
            timed = None
            if seconds > 0 and moved > 0 and transfers > 0 and len(fed) == 1:  # one rank's shard per transfer
                timed = (moved / transfers * entry.decode_tp, seconds * 1e3 / transfers)
            self._observe(entry, timed, int(failed), now)

    def _peers(self, decode_id: str, totals: NixlTotals, last: NixlTotals, now: float) -> None:
        """Each prefill's whole handovers in the window (`PEER`) judge its pair."""
        for prefill, peer in totals.peers.items():
            entry = self.pairs.get((prefill, decode_id))
            before = last.peers.get(prefill, PeerTotals(seconds=0.0, handovers=0.0, kv_bytes=0.0, failed=0.0))
            handovers, failed = peer.handovers - before.handovers, max(0.0, peer.failed - before.failed)
            if entry is None or handovers < 0:
                continue
            timed = None
            if handovers > 0 and peer.kv_bytes > before.kv_bytes:
                timed = ((peer.kv_bytes - before.kv_bytes) / handovers,
                         (peer.seconds - before.seconds) * 1e3 / handovers)
            self._observe(entry, timed, int(failed), now)

    def _observe(self, entry: PairEntry, timed: tuple[float, float] | None, failed: int, now: float) -> None:
        """`timed`: one transfer's (bytes, ms) in the window, if it moved any."""
        measured = seen = None
        if timed is not None:
            measured = kvpath.measured_ms_per_byte(entry.expected_ms_per_byte, entry.latency_ms, *timed, self.rules)
            seen = kvpath.seen_ms_per_byte(entry.latency_ms, *timed)
        if measured is not None or failed:
            entry.state = kvpath.observe(entry.state, now=now, expected_ms_per_byte=entry.expected_ms_per_byte,
                                         observed_ms_per_byte=measured, failed=failed, rules=self.rules,
                                         seen_ms_per_byte=seen)

    def costs(self, now: float) -> dict[Pair, tuple[float, float, bool]]:
        """Per followed pair: (measured ms per byte or 0, weight on the KV transfer, open now)."""
        self.settle(now)
        return {pair: (e.state.ms_per_byte if e.state.samples else 0.0, kvpath.weight(e.state, self.rules),
                       kvpath.open_to(e.state, now)) for pair, e in self.pairs.items()}

    def settle(self, now: float) -> None:
        """Verdicts whose raw verdict held long enough, without new measurements (`kvpath.settle`)."""
        for e in self.pairs.values():
            e.state = kvpath.settle(e.state, now, self.rules)

    def forget(self, replica_ids: set[str]) -> None:
        """Replicas that moved or left: their pairs' and NIXL counters' evidence goes with them."""
        if replica_ids:
            self.pairs = {k: e for k, e in self.pairs.items() if not replica_ids & set(k)}
            self.decodes = {d: n for d, n in self.decodes.items() if d not in replica_ids}
            for n in self.decodes.values():
                n.fed_by -= replica_ids
                n.feeders -= replica_ids

    def chosen(self, pair: Pair) -> None:
        entry = self.pairs.get(pair)
        if entry is not None:
            entry.state = kvpath.probed(entry.state)

    def verdicts(self, now: float) -> tuple[PairVerdict, ...]:
        """Each followed pair's verdict for the controller (the load report's `kv_paths`)."""
        self.settle(now)
        return tuple(PairVerdict(prefill=p, decode=d, verdict=e.state.verdict, tier=e.tier or "-",
                                 measured_gb_s=_gb_s(e.state.seen_ms_per_byte or e.state.ms_per_byte),
                                 expected_gb_s=_gb_s(e.expected_ms_per_byte),
                                 samples=e.state.samples,
                                 avoided=not kvpath.open_to(e.state, now) or e.state.avoided_until is not None)
                     for (p, d), e in sorted(self.pairs.items()))

    def view(self, now: float) -> dict[str, Any]:
        """For /admin/replicas (`kv_pairs`), `isle status` and the verdict gauges."""
        self.settle(now)
        pairs: Mapping[Pair, PairEntry] = self.pairs
        return {
            "verdicts": list(kvpath.VERDICTS),
            "pairs": [{"prefill": p, "decode": d, "pair": f"{p}->{d}", "tier": e.tier, "verdict": e.state.verdict,
                       "bandwidth_ratio": round(e.state.ratio, 4), "samples": e.state.samples,
                       "avoided": not kvpath.open_to(e.state, now) or e.state.avoided_until is not None,
                       "expected_gb_s": round(1e-6 / e.expected_ms_per_byte, 3) if e.expected_ms_per_byte else None,
                       "measured_gb_s": _gb_s(e.state.seen_ms_per_byte or e.state.ms_per_byte)}
                      for (p, d), e in sorted(pairs.items())],
            "decodes": {d: {"nixl_bandwidth_gb_s": round(n.bandwidth_gb_s, 3), "nixl_failed_transfers": n.failed}
                        for d, n in sorted(self.decodes.items()) if n.last is not None},
        }


def _gb_s(ms_per_byte: float) -> float | None:
    return round(1e-6 / ms_per_byte, 3) if ms_per_byte else None
