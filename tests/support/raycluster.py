"""A fake multi-node Ray cluster on loopback for the Ray tiers (`ray.cluster_utils.Cluster`): a
head without GPUs and one Ray node per topology node, each started with the labels and resources
`python -m pools node-labels` gives it; this process connects to it, and both go at the end."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import ray
from ray.cluster_utils import Cluster

from pools.nodelabels import node_labels, node_resources
from topology import Topology


@contextmanager
def fake_cluster(topology: Topology, nodes: Sequence[str], num_gpus: int,
                 labels: Callable[[str, dict[str, str]], dict[str, str]] = lambda _, given: given) -> Iterator[str]:
    """The cluster's address, for the length of the block. `labels` may change what a node is
    started with (a node started with stale arguments, say)."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                             "node_ip_address": "127.0.0.1"})
    try:
        for name in nodes:
            node = topology.node(name)
            cluster.add_node(num_cpus=1, num_gpus=num_gpus, node_ip_address="127.0.0.1",
                             labels=labels(name, node_labels(topology, node)), resources=node_resources(topology, node))
        cluster.wait_for_nodes()
        assert cluster.address.startswith("127.0.0.1:"), "Ray must stay on loopback (tests/conftest.py)"
        ray.init(address=cluster.address, logging_level=logging.ERROR, log_to_driver=False)
        try:
            yield str(cluster.address)
        finally:
            ray.shutdown()
    finally:
        cluster.shutdown()  # type: ignore[no-untyped-call]
