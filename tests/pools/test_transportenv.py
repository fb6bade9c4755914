"""The engine environment check (pools.transportenv): the plan's NIC variables against what the
engine process really has, and the variables that put an RDMA plan's traffic on TCP."""

from __future__ import annotations

import pytest

from pools.model import ReplicaPlacement
from pools.pinning import nic_env, pin_for
from pools.transportenv import transport_mismatches
from tests.conftest import ROOT
from topology import read_source

pytestmark = pytest.mark.unit

RDMA_PLAN = {"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_IB_HCA": "mlx5_0", "UCX_NET_DEVICES": "mlx5_0:1"}
TCP_PLAN = {"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_SOCKET_IFNAME": "eth0", "UCX_NET_DEVICES": "eth0"}


@pytest.mark.parametrize(("planned", "rdma", "extra", "found"), [
    (RDMA_PLAN, True, {}, []),  # the plan as is
    (RDMA_PLAN, True, {"NCCL_IB_HCA": "=mlx5_0:1"}, []),  # exact-match and port forms of the same device
    (RDMA_PLAN, True, {"UCX_TLS": "rc,cuda_copy,cuda_ipc"}, []),
    (RDMA_PLAN, True, {"UCX_TLS": "^dc"}, []),  # excluding DC alone leaves RC (a known fabric workaround)
    (RDMA_PLAN, True, {"UCX_TLS": "ud:aux,rc_x"}, []),
    (RDMA_PLAN, True, {"UCX_TLS": "all"}, []),
    (RDMA_PLAN, True, {"NCCL_IB_DISABLE": "0", "NCCL_NET": "IB"}, []),
    (RDMA_PLAN, True, {"NCCL_SOCKET_IFNAME": "eth0"}, []),  # NCCL's bootstrap sockets: no transport change
    (RDMA_PLAN, True, {"UCX_TLS": "tcp,cuda_copy"}, ["UCX_TLS"]),
    (RDMA_PLAN, True, {"UCX_TLS": "^ib"}, ["UCX_TLS"]),
    (RDMA_PLAN, True, {"UCX_TLS": "^rc,ud,dc"}, ["UCX_TLS"]),
    (RDMA_PLAN, True, {"NCCL_IB_DISABLE": "1"}, ["NCCL_IB_DISABLE"]),
    (RDMA_PLAN, True, {"NCCL_NET": "Socket"}, ["NCCL_NET"]),
    (RDMA_PLAN, True, {"UCX_NET_DEVICES": "mlx5_1:1"}, ["UCX_NET_DEVICES"]),  # another rail
    (RDMA_PLAN, True, {"UCX_NET_DEVICES": "all"}, ["UCX_NET_DEVICES"]),
    (RDMA_PLAN, True, {"NCCL_IB_HCA": "^mlx5_0"}, ["NCCL_IB_HCA"]),
    (RDMA_PLAN, True, {"UCX_NET_DEVICES": "eth0", "UCX_TLS": "tcp", "NCCL_IB_DISABLE": "1"},
     ["UCX_NET_DEVICES", "UCX_TLS", "NCCL_IB_DISABLE"]),
    (TCP_PLAN, False, {"UCX_TLS": "tcp", "NCCL_IB_DISABLE": "1"}, []),  # a TCP plan: TCP is the plan
    (TCP_PLAN, False, {"NCCL_SOCKET_IFNAME": "=eth1"}, ["NCCL_SOCKET_IFNAME"]),
    (RDMA_PLAN, False, {"UCX_TLS": "tcp"}, []),  # not an RDMA fabric: no transport is wrong
    ({"CUDA_VISIBLE_DEVICES": "0"}, True, {"UCX_TLS": "tcp"}, []),  # no NIC planned: nothing implied
])
def test_mismatches(planned: dict[str, str], rdma: bool, extra: dict[str, str], found: list[str]) -> None:
    actual = {**planned, **extra}
    assert [m.variable for m in transport_mismatches(planned, rdma, actual)] == found


def test_unset_planned_variable_and_its_record() -> None:
    actual = {k: v for k, v in RDMA_PLAN.items() if k != "UCX_NET_DEVICES"}
    (m,) = transport_mismatches(RDMA_PLAN, True, actual)
    assert m.to_json() == {"variable": "UCX_NET_DEVICES", "planned": "mlx5_0:1", "actual": None,
                           "why": "unset: the library picks devices itself"}


def test_the_pin_of_an_infiniband_cluster_passes_its_own_check() -> None:
    topology = read_source(str(ROOT / "tests/data/pairs-cluster.yaml"))
    placement = ReplicaPlacement(replica_id="decode-0", pool="decode", role="decode", node="a", gpus=(2, 3),
                                 island="a:2", tier="nvlink", in_island=True)
    pin = pin_for(topology, placement, None, {})
    assert pin.rdma and pin.env["NCCL_IB_HCA"] == "mlx5_1" and pin.env["UCX_NET_DEVICES"] == "mlx5_1:1"
    assert transport_mismatches(pin.env, pin.rdma, dict(pin.env)) == ()
    assert [m.variable for m in transport_mismatches(pin.env, pin.rdma, {**pin.env, "UCX_TLS": "tcp"})] == ["UCX_TLS"]
    assert nic_env([], rdma=True) == {}
