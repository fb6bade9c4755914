"""From a placement to a running replica: its launch (`build_launch`, pure: the engine, the
pinning, for vLLM its pool's settings and the ports it gets on its node) and its start
(`start_one`, `start_all`): vLLM replicas start side by side (a server takes minutes to load a
big model), and a replica that finds one of its ports taken on its node is started again on
other ports.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from control.backend import Backend, Replica
from control.launch import gang
from control.nodecheck import RayNode
from control.spec import EngineLaunch, VllmLaunch, kv_events_args
from pools.model import PlacementPlan, ReplicaPlacement
from pools.pinning import pin_for
from pools.ports import EnginePorts, PortInUse, PortPlan, allocate
from pools.vllmconfig import VllmSettings
from topology import Topology
from wire.client import is_loopback

PORT_ATTEMPTS = 4
"""A replica whose ports are taken on its node is tried on this many sets of ports."""
MAX_PARALLEL_STARTS = 16


@dataclass(frozen=True, slots=True, kw_only=True)
class Started:
    replica: Replica
    launch: EngineLaunch
    """As started (its ports may differ from the first ones it was given)."""
    url: str
    env: Mapping[str, Mapping[str, str]] | None = None
    """The engine process's environment as its host read it right after the start (the pinning
    and transport variables, `control.spec.ENGINE_ENV`), by replica or gang rank id; None: unread."""


def engine_envs(replica: Replica) -> dict[str, dict[str, str]] | None:
    """What the replica (each rank of a gang) reports of its engine's environment; None when it
    says nothing (a replica without a process) or cannot be asked."""
    try:
        info = replica.info()
    except Exception:  # the start succeeded: a failed look leaves the check undone, nothing more
        return None
    ranks = info.get("ranks")
    found = {rid: dict(r["env"]) for rid, r in ranks.items() if isinstance(r.get("env"), dict)} \
        if isinstance(ranks, dict) else {str(info.get("replica_id", "")): dict(info["env"])} \
        if isinstance(info.get("env"), dict) else {}
    return found or None


def build_launch(plan: PlacementPlan, topology: Topology, bindings: Mapping[str, RayNode], p: ReplicaPlacement,
                 generation: int, *, topology_source: str, time_scale: float,
                 vllm: VllmSettings | None = None, ports: EnginePorts | None = None,
                 admin_routes: bool = False, admin_token: str = "", api_key: str = "",
                 engine_args: tuple[str, ...] = (), kv_events_endpoint: str = "", kv_block_size: int = 16,
                 host_names: Collection[str] = ()) -> EngineLaunch:
    """`vllm`: the pool's settings for a real vLLM server (`ports` then required), else a simulated
    engine (`engine_args`: its pool's serving flags). A gang: one simulated engine per
    data-parallel rank (`EngineLaunch.ranks`). With `kv_events_endpoint` (not for a gang's ranks),
    prefix caching on and its events published there (`control.spec.kv_events_args`), when the
    engine runs on the router's host: the endpoint is loopback, so only an engine on a Ray node
    with a loopback address (this product's local Ray) or one of `host_names` (the controller's
    address and hostname: the router shares its host) can reach it."""
    pool = plan.pool(p.pool)
    if pool.is_gang and p.members:
        if vllm is not None:
            raise ValueError(f"{p.replica_id}: the controller starts gangs on the simulated engine only "
                             "(control.replicas.vllm.gang builds their vLLM commands)")
        ranks = tuple(dataclasses.replace(
            build_launch(plan, topology, bindings, gang.rank_placement(p, k), generation,
                         topology_source=topology_source, time_scale=time_scale, admin_routes=admin_routes,
                         admin_token=admin_token, api_key=api_key, engine_args=engine_args),
            gang=gang.gang_arg(pool, p, k))
            for k in gang.ranks_of(p))
        return dataclasses.replace(ranks[0], replica_id=p.replica_id, gang="", ranks=ranks)
    node = topology.node(p.node)
    gpu = node.gpu(p.gpus[0]).model
    if vllm is None and (pool.model is None or gpu is None):
        raise ValueError(f"{p.replica_id}: a simulated replica needs the pool's model and the GPU's model")
    ray = bindings.get(p.node)
    pin = pin_for(topology, p, ray.node_id if ray else None, ray.resources if ray else {})
    engine = None
    if vllm is not None:
        if ports is None:
            raise ValueError(f"{p.replica_id}: a vLLM replica needs its ports")
        cpus = tuple(node.gpu(g).cpu_affinity or "" if node.has_gpu(g) else "" for g in p.gpus)
        engine = VllmLaunch(settings=vllm, ports=ports, gpu_cpus=cpus)
    return EngineLaunch(replica_id=p.replica_id, pool=p.pool, role=p.role,
                        model=pool.model or (vllm.served_model_name if vllm else p.pool), gpu=gpu or "", tp=pool.tp,
                        node=p.node, gpus=p.gpus, topology_source=topology_source, time_scale=time_scale, pin=pin,
                        generation=generation, vllm=engine, admin_routes=admin_routes, admin_token=admin_token,
                        api_key=api_key, engine_args=() if vllm is not None else engine_args,
                        kv_events=kv_events_args(kv_events_endpoint, p.replica_id, kv_block_size)
                        if kv_events_endpoint and same_host(ray, host_names) else ())


def same_host(ray: RayNode | None, host_names: Collection[str]) -> bool:
    """The engine's Ray node is this host (unknown counts as this host: no Ray, or one node)."""
    return ray is None or not ray.address or is_loopback(ray.address) or ray.address in host_names


def ports_taken(launches: Iterable[EngineLaunch], node: str) -> set[int]:
    """The engine ports the given launches hold on `node`."""
    return {port for x in launches if x.node == node and x.vllm is not None for port in x.vllm.ports.all()}


def next_ports(plan: PortPlan, launch: EngineLaunch, taken: set[int]) -> EngineLaunch:
    """The launch on the lowest ports of its node that are not in `taken`."""
    assert launch.vllm is not None
    ports = allocate(plan, launch.node, taken, side_channel=launch.role != "mixed")
    return dataclasses.replace(launch, vllm=dataclasses.replace(launch.vllm, ports=ports))


def stop_quietly(replica: Replica) -> None:
    with contextlib.suppress(Exception):  # an actor on a lost node is already gone
        replica.stop()


def start_one(backend: Backend, launch: EngineLaunch, reallocate: Callable[[EngineLaunch, int], EngineLaunch],
              created: Callable[[Replica], None] | None = None) -> Started:
    """Create and start the replica; on `PortInUse`, `reallocate(launch, busy_port)` gives the next try.
    Anything else: the replica is stopped and the error raised. `created` hears of each replica
    as soon as it exists (before its start ends: whoever must abort the start stops it); what it
    raises aborts the start, as a failed start."""
    for attempt in range(1, PORT_ATTEMPTS + 1):
        replica = gang.create(backend, launch)
        try:
            if created is not None:
                created(replica)
            url = replica.start()
            return Started(replica=replica, launch=launch, url=url, env=engine_envs(replica))
        except PortInUse as err:
            stop_quietly(replica)
            if attempt == PORT_ATTEMPTS:
                raise
            launch = reallocate(launch, err.port)
        except BaseException:
            stop_quietly(replica)
            raise
    raise AssertionError("unreachable")


def start_all(backend: Backend, launches: Sequence[EngineLaunch],
              reallocate: Callable[[EngineLaunch, int], EngineLaunch]) -> list[Started | Exception]:
    """Every launch started at once (vLLM servers; simulated engines start in a second, one after
    the other: a local one dies with the thread that started it, PR_SET_PDEATHSIG); each result
    in order, an exception where one failed."""
    if not launches:
        return []

    def one(launch: EngineLaunch) -> Started | Exception:
        try:
            return start_one(backend, launch, reallocate)
        except Exception as err:
            return err

    if all(x.vllm is None for x in launches):
        return [one(x) for x in launches]
    with ThreadPoolExecutor(min(len(launches), MAX_PARALLEL_STARTS), thread_name_prefix="isle-start") as pool:
        return list(pool.map(one, launches))
