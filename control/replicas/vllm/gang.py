"""How one gang replica (data-parallel ranks, pipeline stages, expert parallelism) is started
with vLLM, node by node, as plain data (pure: no processes, no I/O).

`gang_launches(placement, pool, settings)` gives one `RankGroupLaunch` per node of the gang, in
rank order, following `control.replicas.vllm.command`'s conventions (`python -m` API_SERVER_MODULE,
`--scheduling-policy priority`, NIXL's kv-transfer config for prefill and decode roles):

- data parallel, vLLM's internal load balancing: one process per node with
  `--data-parallel-size-local` (the ranks it holds) and, on every node but the head (the first
  member's), `--data-parallel-start-rank` and `--headless`; all share the head's address and RPC
  port. vLLM gives each node one contiguous range of ranks, and local rank i the i-th `tp`
  devices of CUDA_VISIBLE_DEVICES, which is why the devices are listed in rank order;
- external load balancing (`external_lb`): one API server per DP rank (`--data-parallel-rank`),
  each on its own HTTP port, so the router balances the ranks itself;
- pipeline stages, or a TP group spanning nodes of a multi-node NVLink domain: vLLM's Ray
  executor, driven by one process on the head node (see `ray_bundles` for the placement group).

NIC selection: `NCCL_IB_HCA` / `UCX_NET_DEVICES` name the node's members' NICs (a node-wide list:
one process starts every rank of a node). With PCI bus ids known, vLLM (0.33) picks each worker's
own NIC itself from `VLLM_GPU_NIC_PCIE_MAPPING` and `VLLM_NIC_SELECTION_VARS`, prepending it to
those lists. DeepEP's NVSHMEM cannot be steered per rank from here: NVSHMEM_HCA_LIST is read per
process, DeepEP starts NVSHMEM so that every PE has node-local index 0 (NVSHMEM_HCA_PE_MAPPING
does not help), and one vLLM process starts all ranks of a node; a per-rank NIC needs DeepEP's
own per-device patch (DeepEP PR #466, carried by llm-d).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from control.replicas.vllm.command import API_SERVER_MODULE, DEFAULT_CONNECTOR, KV_ROLES
from pools.experts.engine import ENV as EXPERT_SPEC_ENV
from pools.experts.engine import LOAD_DIR_ENV, ExpertSpec
from pools.model import ROLES, GangMember, PoolSpec, ReplicaPlacement, Role
from pools.pinning import gpu_resource, nic_env
from topology import Tier
from topology.model import Nic

All2AllBackend = Literal["deepep_high_throughput", "deepep_low_latency", "allgather_reducescatter"]
NIC_SELECTION_VARS = "NCCL_IB_HCA:1,UCX_NET_DEVICES:1"
"""vLLM's VLLM_NIC_SELECTION_VARS: which variables get each worker's RDMA device (`<dev>:1`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EplbSettings:
    """vLLM's expert-parallel load balancer (`--enable-eplb --eplb-config`); defaults are vLLM's."""

    num_redundant_experts: int = 0
    window_size: int = 1000
    step_interval: int = 3000

    def __post_init__(self) -> None:
        if self.num_redundant_experts < 0 or self.window_size < 1 or self.step_interval < 1:
            raise ValueError(f"EPLB: num_redundant_experts {self.num_redundant_experts} must be >= 0, window_size "
                             f"{self.window_size} and step_interval {self.step_interval} >= 1")

    def to_json(self) -> str:
        return json.dumps({"num_redundant_experts": self.num_redundant_experts, "window_size": self.window_size,
                           "step_interval": self.step_interval}, separators=(",", ":"))


@dataclass(frozen=True, slots=True, kw_only=True)
class GangSettings:
    """What the plan does not say: the model, the head's address and the ports."""

    model: str
    """A Hugging Face model id or a local model directory."""
    address: str
    """The head node's address (--data-parallel-address), as the other nodes reach it."""
    served_model_name: str | None = None
    """None: the pool's model name, else `model`."""
    port: int = 8000
    """HTTP port of the head's API server; with external_lb, of a node's first rank (+1 per rank)."""
    rpc_port: int = 29550
    """--data-parallel-rpc-port, the same on every node."""
    host: str = "0.0.0.0"
    """The address the API servers listen on."""
    external_lb: bool = False
    eplb: EplbSettings | None = None
    side_channel_port: int = 5600
    """NIXL handshake port (prefill/decode roles); vLLM adds the DP rank."""
    node_addresses: Mapping[str, str] = field(default_factory=dict)
    """Node -> address (VLLM_HOST_IP, NIXL side channel); the head's defaults to `address`."""
    gpu_nic_bus_ids: Mapping[str, Mapping[int, tuple[str, str]]] = field(default_factory=dict)
    """Node -> GPU index -> (GPU PCI bus id, NIC PCI bus id), for VLLM_GPU_NIC_PCIE_MAPPING."""
    python: str = "python"
    extra_args: tuple[str, ...] = ()
    expert_spec: ExpertSpec | None = None
    """The gang's expert spec for the isleserve vLLM plugin (`ISLE_EXPERT_SPEC` in every
    process): with EPLB on, vLLM's policy becomes the topology policy over these domains."""
    expert_load_dir: str | None = None
    """Where the plugin writes the load windows vLLM's EPLB hands it (`ISLE_EXPERT_LOAD_DIR`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RankGroupLaunch:
    """One process of a gang: what runs on `node`, for DP ranks `dp_ranks`, on GPUs `gpus`."""

    node: str
    argv: list[str]
    env: dict[str, str]
    dp_ranks: tuple[int, ...]
    headless: bool
    gpus: tuple[int, ...]
    port: int | None = None
    """The HTTP port it serves; None when headless."""

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "argv": list(self.argv), "env": dict(self.env), "dp_ranks": list(self.dp_ranks),
                "headless": self.headless, "gpus": list(self.gpus), "port": self.port}


def all2all_backend(role: Role, tier: Tier, rdma: bool) -> All2AllBackend:
    """vLLM's --all2all-backend for an expert-parallel gang whose worst link is `tier`.

    DeepEP moves tokens over NVLink inside a node or NVLink domain and over RDMA (NVSHMEM/IBGDA)
    between nodes; it has no PCIe-only or TCP path, so there (`pcie`, `numa`, `tcp`, or `rack`
    without RDMA NICs) the gang uses vLLM's default all-gather/reduce-scatter. Where DeepEP
    works, prefill takes the high-throughput kernels (large token batches, bandwidth-bound) and
    decode the low-latency ones (small batches, CUDA-graph friendly). A mixed replica runs both
    batch shapes in one engine, which neither DeepEP mode serves well (the low-latency buffers
    cap tokens per rank, the high-throughput ones do not capture into CUDA graphs), so it keeps
    all-gather/reduce-scatter."""
    deepep = tier in ("local", "nvlink", "rdma") or (tier == "rack" and rdma)
    if not deepep or role == "mixed":
        return "allgather_reducescatter"
    return "deepep_high_throughput" if role == "prefill" else "deepep_low_latency"


def uses_ray_executor(placement: ReplicaPlacement, pool: PoolSpec) -> bool:
    """Pipeline stages, or a TP group on more than one node: vLLM's Ray executor runs them."""
    nodes: dict[tuple[int, int], set[str]] = {}
    for m in placement.members:
        nodes.setdefault((m.pp_stage, m.dp_rank_start), set()).add(m.node)
    return pool.pp > 1 or any(len(n) > 1 for n in nodes.values())


def ray_bundles(placement: ReplicaPlacement) -> list[dict[str, float]]:
    """The placement group for a Ray-executor gang: one bundle per GPU in rank order (stage by
    stage, TP ranks within a stage), each `{"GPU": 1, "isle_gpu_<node>_<i>": 1}`.

    vLLM's Ray executor takes the first world-size GPU bundles in placement-group order, so the
    launcher creates them in exactly this order and runs vLLM inside that group (a plain
    `python -m` server outside it makes its own, unpinned group). Ray's built-in node resource
    is `node:<ip>`, and a plan knows node names, not addresses: the bundles use the per-GPU
    resource `python -m pools node-labels` declares on each node instead (it also reserves the
    planned GPU against other replicas). Ray still picks which of the node's GPUs a bundle gets.
    vLLM then re-sorts its workers (driver's node first, then nodes with fewer workers, then by
    IP address as a string): `ray_stage_order_kept` says whether that keeps the stage order."""
    return [{"GPU": 1.0, gpu_resource(m.node, g): 1.0} for m in _rank_order(placement.members) for g in m.gpus]


def ray_stage_order_kept(placement: ReplicaPlacement, node_ips: Mapping[str, str]) -> bool:
    """True when vLLM's worker re-sort (the driver on the head node) leaves the ranks on the
    nodes `ray_bundles` puts them on."""
    nodes = [m.node for m in _rank_order(placement.members) for _ in m.gpus]
    counts = {n: nodes.count(n) for n in nodes}
    head = nodes[0]
    resorted = sorted(nodes, key=lambda n: (n != head, counts[n], node_ips.get(n, n)))
    return resorted == nodes


def gang_launches(placement: ReplicaPlacement, pool: PoolSpec, settings: GangSettings) -> list[RankGroupLaunch]:
    """Every process that starts this gang, the head node's first."""
    check(placement, pool, settings)
    if uses_ray_executor(placement, pool):
        return [_ray_launch(placement, pool, settings)]
    by_node = _node_members(placement.members)
    if settings.external_lb:
        return [_rank_launch(placement, pool, settings, node, m, k) for node, members in by_node
                for k, m in enumerate(members)]
    return [_node_launch(placement, pool, settings, node, members, k == 0) for k, (node, members)
            in enumerate(by_node)]


def check(placement: ReplicaPlacement, pool: PoolSpec, settings: GangSettings) -> None:
    """Raise ValueError naming every way the placement, pool and settings disagree."""
    name, members, problems = placement.replica_id, placement.members, []
    if not members:
        raise ValueError(f"gang {name}: the placement has no members (not a gang, or a plan without `members`)")
    if placement.pool != pool.name:
        problems.append(f"placement is of pool {placement.pool!r}, pool spec is {pool.name!r}")
    groups: dict[tuple[int, int], int] = {}
    for m in members:
        groups[(m.pp_stage, m.dp_rank_start)] = groups.get((m.pp_stage, m.dp_rank_start), 0) + len(m.gpus)
    want = {(s, r) for s in range(pool.pp) for r in range(pool.dp)}
    if set(groups) != want:
        problems.append(f"members hold (stage, DP rank) {sorted(groups)}, pool wants pp={pool.pp} x dp={pool.dp}")
    wrong = {k: n for k, n in groups.items() if n != pool.tp}
    if wrong:
        problems.append(f"TP groups {sorted(wrong.items())} do not have tp={pool.tp} GPUs")
    ray = uses_ray_executor(placement, pool)
    if ray and pool.dp > 1:
        problems.append(f"dp={pool.dp} with pp={pool.pp} or a TP group over several nodes: vLLM's Ray executor "
                        "drives one DP rank here, so such a gang must have dp=1")
    if settings.external_lb and (ray or pool.dp < 2):
        problems.append(f"external_lb needs dp > 1 on the multiprocessing executor (pool has dp={pool.dp})")
    if not ray:
        problems += _rank_layout_problems(members)
    problems += _port_problems(placement, settings)
    spec = settings.expert_spec
    if spec is not None and spec.ranks != pool.tp * pool.dp:
        problems.append(f"the expert spec names {spec.ranks} EP ranks, the pool has tp x dp = {pool.tp * pool.dp}")
    if problems:
        raise ValueError(f"gang {name}: {'; '.join(problems)}")


def _rank_layout_problems(members: Sequence[GangMember]) -> list[str]:
    """vLLM gives each node one contiguous range of DP ranks, nodes in rank order."""
    out, last = [], -1
    for node, held in _node_members(members):
        ranks = sorted({m.dp_rank_start for m in held})
        if ranks != list(range(ranks[0], ranks[0] + len(ranks))) or ranks[0] <= last:
            out.append(f"node {node} holds DP ranks {ranks}: vLLM needs a contiguous range after the previous node's")
        last = ranks[-1]
    return out


def _port_problems(placement: ReplicaPlacement, settings: GangSettings) -> list[str]:
    per_node = max(len(ms) for _, ms in _node_members(placement.members)) if settings.external_lb else 1
    out = [f"{what} {port} is out of range 1..65535" for what, port in
           (("port", settings.port), ("rpc_port", settings.rpc_port), ("side_channel_port", settings.side_channel_port))
           if not 0 < port < 65536]
    if not out and settings.port + per_node - 1 > 65535:
        out.append(f"ports {settings.port}..{settings.port + per_node - 1} (one per rank) pass 65535")
    if not out and settings.port <= settings.rpc_port < settings.port + per_node:
        out.append(f"rpc_port {settings.rpc_port} is an HTTP port")
    if placement.role not in ROLES:
        out.append(f"role {placement.role!r} is not one of {ROLES}")
    return out


def _rank_order(members: Sequence[GangMember]) -> list[GangMember]:
    return sorted(members, key=lambda m: (m.pp_stage, m.dp_rank_start))


def _node_members(members: Sequence[GangMember]) -> list[tuple[str, list[GangMember]]]:
    """Members per node, nodes in the order of their first rank, members in rank order."""
    out: dict[str, list[GangMember]] = {}
    for m in _rank_order(members):
        out.setdefault(m.node, []).append(m)
    return list(out.items())


def _base_argv(placement: ReplicaPlacement, pool: PoolSpec, settings: GangSettings, port: int | None) -> list[str]:
    served = settings.served_model_name or pool.model or settings.model
    argv = [settings.python, "-m", API_SERVER_MODULE, "--model", settings.model, "--served-model-name", served]
    if port is not None:
        argv += ["--host", settings.host, "--port", str(port)]
    # the router forwards each SLO class as `priority`; vLLM rejects it under fcfs
    argv += ["--tensor-parallel-size", str(pool.tp), "--scheduling-policy", "priority"]
    if pool.expert_parallel:
        # pinning's rule for what an RDMA device is: a NIC that NCCL's IB transport would take
        rdma = all(m.nic is not None and "NCCL_IB_HCA" in nic_env([Nic(name=m.nic)], rdma=True)
                   for m in placement.members)
        argv += ["--enable-expert-parallel", "--all2all-backend", all2all_backend(pool.role, placement.tier, rdma)]
    if settings.eplb is not None:
        argv += ["--enable-eplb", "--eplb-config", settings.eplb.to_json()]
    kv_role = KV_ROLES.get(pool.role)
    if kv_role is not None:
        kv = {"kv_connector": DEFAULT_CONNECTOR, "kv_role": kv_role, "engine_id": placement.replica_id}
        argv += ["--kv-transfer-config", json.dumps(kv, sort_keys=True, separators=(",", ":"))]
    return argv


def _dp_argv(pool: PoolSpec, settings: GangSettings) -> list[str]:
    return ["--data-parallel-size", str(pool.dp), "--data-parallel-address", settings.address,
            "--data-parallel-rpc-port", str(settings.rpc_port)]


def _env(placement: ReplicaPlacement, settings: GangSettings, node: str, members: Sequence[GangMember],
         pin_devices: bool) -> dict[str, str]:
    env = {"PYTHONUNBUFFERED": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    head = placement.members[0].node
    address = settings.node_addresses.get(node) or (settings.address if node == head else None)
    if address is not None:
        env["VLLM_HOST_IP"] = address
    gpus = [g for m in members for g in m.gpus]
    if pin_devices:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    nics = list(dict.fromkeys(m.nic for m in members if m.nic is not None))
    env.update(nic_env([Nic(name=n) for n in nics], rdma=placement.tier != "tcp"))
    bus_ids = settings.gpu_nic_bus_ids.get(node, {})
    if gpus and all(g in bus_ids for g in gpus):
        env["VLLM_GPU_NIC_PCIE_MAPPING"] = ",".join(f"{bus_ids[g][0]}={bus_ids[g][1]}" for g in gpus)
        env["VLLM_NIC_SELECTION_VARS"] = NIC_SELECTION_VARS
    if settings.expert_spec is not None:
        env[EXPERT_SPEC_ENV] = settings.expert_spec.to_json()
        # vLLM's Ray executor copies only VLLM_*, NCCL_*, ... to its workers: name ours
        env["VLLM_RAY_EXTRA_ENV_VARS_TO_COPY"] = f"{EXPERT_SPEC_ENV},{LOAD_DIR_ENV}"
    if settings.expert_load_dir:
        env[LOAD_DIR_ENV] = settings.expert_load_dir
    if placement.role != "mixed":
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(settings.side_channel_port)
        if address is not None:
            env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = address
    return env


def _node_launch(placement: ReplicaPlacement, pool: PoolSpec, settings: GangSettings, node: str,
                 members: list[GangMember], head: bool) -> RankGroupLaunch:
    """vLLM's internal load balancing: one process for all of this node's ranks."""
    ranks = tuple(sorted({m.dp_rank_start for m in members}))
    port = settings.port if head else None
    argv = _base_argv(placement, pool, settings, port)
    if pool.dp > 1:
        argv += [*_dp_argv(pool, settings), "--data-parallel-size-local", str(len(ranks))]
        if not head:
            argv += ["--data-parallel-start-rank", str(ranks[0]), "--headless"]
    return RankGroupLaunch(node=node, argv=[*argv, *settings.extra_args],
                           env=_env(placement, settings, node, members, pin_devices=True), dp_ranks=ranks,
                           headless=not head, gpus=tuple(g for m in members for g in m.gpus), port=port)


def _rank_launch(placement: ReplicaPlacement, pool: PoolSpec, settings: GangSettings, node: str,
                 member: GangMember, local_index: int) -> RankGroupLaunch:
    """External load balancing: one API server per DP rank, each on its own port."""
    port = settings.port + local_index
    argv = [*_base_argv(placement, pool, settings, port), *_dp_argv(pool, settings),
            "--data-parallel-rank", str(member.dp_rank_start), *settings.extra_args]
    return RankGroupLaunch(node=node, argv=argv, env=_env(placement, settings, node, [member], pin_devices=True),
                           dp_ranks=(member.dp_rank_start,), headless=False, gpus=member.gpus, port=port)


def _ray_launch(placement: ReplicaPlacement, pool: PoolSpec, settings: GangSettings) -> RankGroupLaunch:
    """One driver on the head node; Ray starts every worker and sets its CUDA_VISIBLE_DEVICES."""
    members = _rank_order(placement.members)
    head = members[0].node
    argv = [*_base_argv(placement, pool, settings, settings.port), "--pipeline-parallel-size", str(pool.pp),
            "--distributed-executor-backend", "ray", *settings.extra_args]
    # the driver's NCCL_/UCX_ variables reach every Ray worker: name every node's NICs
    env = _env(placement, settings, head, members, pin_devices=False)
    return RankGroupLaunch(node=head, argv=argv, env=env, dp_ranks=(0,), headless=False,
                           gpus=tuple(g for m in members if m.node == head for g in m.gpus), port=settings.port)
