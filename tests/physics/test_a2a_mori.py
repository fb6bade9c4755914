"""MoRI's inter-node low-latency kernels as their source moves a token (ROCm/mori
src/ops/dispatch_combine/internode_v1.cpp @013c13bc): once per remote node, to the rank of the same
local index there, which copies it on over XGMI; every remote node, routed or not."""

from __future__ import annotations

import pytest

from loadtest.fidelity import constants
from loadtest.fidelity import report as fidelity
from physics import a2akernels
from physics.alltoall import GangLinks, a2a_parts, remote_domains

pytestmark = pytest.mark.unit

FACTORS_ONE = {"mori-ep-ll.bandwidth": 1.0, "mori-ep-ll.latency": 1.0}


def _links() -> GangLinks:
    # a fast NVLink line so that the NIC binds in both kernels
    return GangLinks(carrier="rdma", domain_ranks=8, nvlink_gb_s=1e6, nic_gb_s=50.0)


def test_moris_low_latency_kernels_cross_the_network_once_per_remote_node() -> None:
    """At EP16 over two nodes a DeepEP low-latency call sends each (token, expert) pair bound for the
    other node (4 of a token's 8, on average); MoRI's sends the token once: a quarter of the bytes."""
    assert a2akernels.kernel("mori-ep-ll").dedupe and a2akernels.kernel("mori-ep-ll").every_node
    with constants.applied(FACTORS_ONE):
        _, mori = a2a_parts(128, 7168, 8, 1.0, 16, _links(), "mori-ep-ll")
        _, deepep = a2a_parts(128, 7168, 8, 1.0, 16, _links(), "deepep-ll")
    assert mori == pytest.approx(deepep / 4, rel=0.01)


def test_moris_low_latency_kernels_send_every_token_to_every_remote_node() -> None:
    """Over 8 nodes the low-latency kernel sends a token to all 7 others; its normal kernel (and
    DeepEP's) only to the nodes its experts touch (4.6 of them, uniform routing)."""
    with constants.applied({**FACTORS_ONE, "mori-ep.bandwidth": 1.0, "mori-ep.latency": 1.0}):
        _, ll = a2a_parts(128, 7168, 8, 1.0, 64, _links(), "mori-ep-ll")
        _, normal = a2a_parts(128, 7168, 8, 1.0, 64, _links(), "mori-ep")
    assert ll / normal == pytest.approx(7.0 / remote_domains(8, 8, 0), rel=0.01)


def test_moris_published_low_latency_rows_are_priced_within_25_percent() -> None:
    """MORI README, MI300X + CX7, EP16-V1-LL, 128 tokens: dispatch 76 µs, combine 122 µs."""
    ids = {"mori-mi300x-ll-ep16-dispatch", "mori-mi300x-ll-ep16-combine"}
    rows = [r for r in fidelity.rows() if r.id in ids]
    assert {r.id for r in rows} == ids
    assert all(r.within for r in rows), {r.id: r.ratio for r in rows}
