"""What an expert map does to a gang: routed load per GPU, balancedness, bytes crossing domains.

Tokens arrive at every rank alike (the router balances the ranks), so a domain sends its share
of the tokens (its GPUs over the gang's). With `locality` (the isleserve vLLM plugin's replica
choice, `vllmplugin.locality`), a token goes to a replica of each of its experts inside its own
domain when there is one (split evenly over them), else to any replica (split evenly). Without
it (vLLM's own choice: a hash of the token's position modulo the expert's replica count), a
token goes to any replica, split evenly. Per (token, expert) pair that leaves the domain, the
dispatch carries the hidden vector out and the combine brings it back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pools.model import ReplicaPlacement
from topology import GpuRef, Topology, islands
from topology.islands import island_of


@dataclass(frozen=True, slots=True)
class Gang:
    """The GPUs of an EP gang in EP-rank order, with the NVLink domain and host of each."""

    gpus: tuple[GpuRef, ...]
    domain: tuple[str, ...]
    host: tuple[str, ...]

    @classmethod
    def of(cls, topology: Topology, placement: ReplicaPlacement) -> Gang:
        refs = tuple(GpuRef(n, g) for n, g in placement.gpu_refs())
        where = island_of(islands(topology))
        return cls(gpus=refs, domain=tuple(where[r].id for r in refs), host=tuple(r.node for r in refs))

    @classmethod
    def uniform(cls, domains: int, gpus_per_domain: int, hosts_per_domain: int = 1) -> Gang:
        """A made-up gang (tests, the cost command): `domains` domains of `gpus_per_domain` GPUs."""
        per_host = max(1, gpus_per_domain // hosts_per_domain)
        refs = tuple(GpuRef(f"d{d}-h{k // per_host}", k) for d in range(domains) for k in range(gpus_per_domain))
        return cls(gpus=refs, domain=tuple(f"d{d}" for d in range(domains) for _ in range(gpus_per_domain)),
                   host=tuple(r.node for r in refs))

    @property
    def size(self) -> int:
        return len(self.gpus)

    def weights(self) -> dict[str, float]:
        """Each domain's share of the tokens."""
        out: dict[str, float] = {}
        for d in self.domain:
            out[d] = out.get(d, 0.0) + 1.0 / len(self.domain)
        return out


def gang_from_plan(placement: ReplicaPlacement) -> Gang:
    """The gang's GPUs and domains from the plan JSON alone (module docstring)."""
    labels = [x for x in placement.island.split("+") if x]
    shared = [x for x in labels if x.startswith("nvl:")]
    refs, domains = [], []
    for n, g in placement.gpu_refs():
        own = [x for x in labels if x.startswith(f"{n}/island")]
        if len(own) == 1:
            domains.append(own[0])
        elif not own and len(shared) == 1:
            domains.append(shared[0])
        else:
            raise ValueError(f"{placement.replica_id}: cannot tell {n}:gpu{g}'s NVLink domain from the plan "
                             f"(islands {labels}); pass --topology")
        refs.append(GpuRef(n, g))
    return Gang(gpus=tuple(refs), domain=tuple(domains), host=tuple(r.node for r in refs))


LayerMap = tuple[tuple[int, ...], ...]
"""One layer's map: the logical experts each GPU holds (physical slots), by EP rank."""


@dataclass(frozen=True, slots=True)
class LayerStats:
    gpu_load: tuple[float, ...]
    """Share of the layer's (token, expert) pairs each GPU serves."""
    cross_share: float
    """Share of the pairs whose expert is served outside the token's domain."""

    @property
    def balancedness(self) -> float:
        top = max(self.gpu_load, default=0.0)
        return sum(self.gpu_load) / len(self.gpu_load) / top if top > 0 else 1.0


def replicas(layer: LayerMap, experts: int) -> list[list[int]]:
    """GPU indices holding each logical expert."""
    out: list[list[int]] = [[] for _ in range(experts)]
    for gpu, held in enumerate(layer):
        for e in held:
            out[e].append(gpu)
    return out


def route(shares: Sequence[float], layer: LayerMap, gang: Gang, locality: bool = True) -> LayerStats:
    """The routed load and cross-domain share of one layer (module docstring)."""
    weights = gang.weights()
    load = [0.0] * gang.size
    cross = 0.0
    for e, where in enumerate(replicas(layer, len(shares))):
        p = shares[e]
        if p <= 0:
            continue
        if not where:
            raise ValueError(f"expert {e} has no replica in the map")
        local: dict[str, list[int]] = {}
        for g in where:
            local.setdefault(gang.domain[g], []).append(g)
        if not locality:
            for g in where:
                load[g] += p / len(where)
            cross += p * sum(w * (1.0 - len(local.get(d, ())) / len(where)) for d, w in weights.items())
            continue
        miss = sum(w for d, w in weights.items() if d not in local)
        for d, gs in local.items():
            for g in gs:
                load[g] += p * weights[d] / len(gs)
        for g in where:
            load[g] += p * miss / len(where)
        cross += p * miss
    return LayerStats(gpu_load=tuple(load), cross_share=cross)
