"""What the router answers beside the OpenAI API, as pydantic models: `/health` and the admin
views (`router.routes.admin_view`), for the OpenAPI document (`router.openapi`). The router
writes these bodies itself (a dict to JSON, off the request path); the models say their shape,
and the document's test checks real answers against them."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from wire.protocol import Absent


class View(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)


class Health(View):
    """The router is up (it says nothing of the replicas' health: `/admin/replicas` does). Always
    HTTP 200, "degraded" included: the data plane serves."""

    status: str
    """"ok", or "degraded": the controller cannot write its state (a full disk), see `reasons`."""
    replicas: int
    """Replicas in the routing table this worker follows."""
    reasons: list[str] | Absent = None
    """Only when degraded: what is wrong, one line each."""


class ReplicaView(View):
    replica_id: str
    url: str
    model: str
    pool: str
    role: str
    """prefill, decode or mixed."""
    node: str
    gpus: list[int]
    tier: str
    """Where the replica's GPUs sit from the router's point of view (its network tier)."""
    healthy: bool
    draining: bool
    breaker_open: bool
    """Failed often enough that the router sends it nothing for a while."""
    running: float
    waiting: float
    kv_usage: float
    """The engine's KV cache use, 0 to 1, from its last scraped `/metrics`."""
    inflight: int
    """Requests this worker has at the replica now."""
    latency_ms: float
    """Moving average of the replica's time to first byte, as this worker saw it."""


class ReplicasView(View):
    """The replicas as this worker of the router sees them."""

    version: int
    """The routing table's version."""
    worker: int
    """The worker that answered (0: the leader)."""
    replicas: list[ReplicaView]


class PlacementView(View):
    replica_id: str
    pool: str
    role: str
    node: str
    gpus: list[int]
    island: str
    """The NVLink island holding the replica's GPUs ('a+b' when it spans islands)."""
    tier: str
    extra_nodes: dict[str, list[int]] | Absent = None
    """GPUs on further nodes, when a group spans nodes (topology-blind baselines only)."""
    reasons: list[str]


class TargetGroup(View):
    """One target group of Prometheus' HTTP service discovery (`http_sd_config`): the router, or
    one engine with its placement as labels (`router.targets`)."""

    targets: list[str]
    """host:port to scrape (`/metrics`)."""
    labels: dict[str, str]
    """`component` (router or engine), `role`; an engine's `replica`, `pool`, `model`, `node`,
    `island`, `tier`, and `gang` for a data-parallel rank. Labels without a value are left out."""


class UnplacedView(View):
    pool: str
    count: int
    reason: str


class PlanSummary(View):
    gpus_used: int
    cross_island_tp_groups: int
    score: float


class PlanView(View):
    """The placement plan the routing table was made from, with the controller's own view."""

    policy: str
    topology_fingerprint: str
    placements: list[PlacementView]
    unplaced: list[UnplacedView]
    summary: PlanSummary
    reasons: list[str]
    controller: dict[str, Any] | None = None
    """Under Ray: the controller's state (node checks, marked links, lost nodes, replicas
    starting or draining)."""


class GpuView(View):
    index: int
    model: str | None
    pci_bus_id: str | None
    uuid: str | None
    numa_node: int | None
    cpu_affinity: str | None
    gpu_numa_node: int | None
    memory_gb: float | None
    nvlink_generation: int | None
    fabric_clique: str | None
    healthy: bool
    health_reasons: list[str]


class NicView(View):
    name: str
    nearest_gpus: list[int]
    level: str
    pci_bus_id: str | None
    numa_node: int | None
    speed_gbit_s: float | None
    link_layer: str | None


class LinkHealthView(View):
    score: float
    healthy: bool
    bandwidth_factor: float
    added_latency_us: float
    reasons: list[str]


class LinkView(View):
    a: int
    b: int
    kind: str
    """nvlink, nvswitch, pcie, ... (`topology.kinds.LinkKind`)."""
    lanes: int | None
    bandwidth_gb_s: float
    latency_us: float
    health: LinkHealthView | None
    """null: healthy."""


class NodeView(View):
    name: str
    rack: str | None
    machine: str | None
    source_format: str
    gpus: list[GpuView]
    nics: list[NicView]
    links: list[LinkView]


class MeasuredPathView(View):
    a: str
    b: str
    bandwidth_gb_s: float
    latency_us: float


class FabricView(View):
    kind: str
    technology: str
    nic_bandwidth_gb_s: float
    latency_us: float
    inter_rack_bandwidth_factor: float
    inter_rack_latency_us: float
    measured: list[MeasuredPathView]


class TopologyView(View):
    """The cluster's topology in its lossless JSON form (`topology.serialize`)."""

    format: str
    name: str
    fingerprint: str
    fabric: FabricView
    nodes: list[NodeView]
