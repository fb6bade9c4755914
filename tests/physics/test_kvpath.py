"""A PD pair's KV path under a transport fault (`physics.kvpath`): TCP fallback and a remote NIC
priced by the cost model's own figures."""

from __future__ import annotations

import pytest

from physics import catalog, kvtransfer
from physics.kvpath import NO_FAULT, TCP_CARRIER, KvPathFault
from topology import LinkKind, Path
from topology.kinds import DEFAULTS
from topology.paths import LOCAL

pytestmark = pytest.mark.unit
MODEL = catalog.model("llama-3.1-8b")
NVLINK = [Path(kind=LinkKind.NVSWITCH, tier="nvlink", bandwidth_gb_s=450.0, latency_us=0.5, via=f"GPU{i}-GPU{i + 4}")
          for i in range(2)]
RDMA = Path(kind=LinkKind.RDMA, tier="rdma", bandwidth_gb_s=50.0, latency_us=3.0, via="NIC mlx5_0 -> mlx5_0")


def test_tcp_fallback_is_the_cost_models_tcp_path_on_one_carrier() -> None:
    tcp = KvPathFault(transport="tcp")
    moved = [tcp.path(p) for p in NVLINK]
    assert all(p.kind is LinkKind.TCP and p.tier == "tcp" and p.via == TCP_CARRIER for p in moved)
    line = DEFAULTS[LinkKind.TCP].bandwidth_gb_s
    assert tcp.rate_gb_s(NVLINK[0]) == pytest.approx(line * kvtransfer.KV_LINE_EFFICIENCY)
    assert tcp.handover_ms(MODEL, 8000, NVLINK) == pytest.approx(kvtransfer.kv_handover_ms(MODEL, 8000, moved))
    assert tcp.handover_ms(MODEL, 8000, NVLINK) > 20 * NO_FAULT.handover_ms(MODEL, 8000, NVLINK)
    assert tcp.path(LOCAL) is LOCAL and tcp.handover_ms(MODEL, 8000, [LOCAL]) == 0.0


@pytest.mark.parametrize("p", [NVLINK[0], RDMA])
def test_a_remote_nic_halves_the_rate_not_the_setup(p: Path) -> None:
    half = KvPathFault(bandwidth_factor=0.5)
    setup = kvtransfer.kv_setup_ms(p) + kvtransfer.kv_requests_ms(MODEL, [p])  # neither is a rate
    base = kvtransfer.kv_handover_ms(MODEL, 8000, [p])
    assert half.rate_gb_s(p) == pytest.approx(kvtransfer.kv_rate_gb_s(p) / 2)
    assert half.handover_ms(MODEL, 8000, [p]) - setup == pytest.approx(2 * (base - setup))
    assert half.active and not NO_FAULT.active


@pytest.mark.parametrize("bad", [{"transport": "ucx"}, {"bandwidth_factor": 0.0}, {"bandwidth_factor": 1.5}])
def test_bad_faults_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        KvPathFault(**bad)  # type: ignore[arg-type]
