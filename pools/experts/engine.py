"""What the isleserve vLLM plugin (`vllmplugin`) decides inside vLLM, as plain values (pure: the
plugin turns tensors into lists and back).

- `ExpertSpec`: what the launcher tells every vLLM process of a gang (`ISLE_EXPERT_SPEC`, JSON
  inline or `@FILE`): each EP rank's NVLink domain and host, in EP-rank order (vLLM's EP rank is
  DP rank x TP + TP rank), the catalogue model and GPU that price a step, the gang's links, the
  phase, and whether tokens keep to their domain's replicas (`locality`).
- `rebalance`: vLLM's physical-to-logical map for every layer from EPLB's load window: the
  `topology` policy with the spec's step as objective, and vLLM's own map as the rival it must
  beat; each rank's slots keep the experts they already hold where the new map keeps them on
  that rank (fewer weights move).
- `local_replicas`: for one rank, each logical expert's physical slots inside the rank's domain
  when there are any, else all of them: what vLLM's MoE router then picks from.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, get_args

from physics import catalog
from physics.alltoall import Carrier, GangLinks
from pools.experts.metrics import Gang, LayerMap, gang_from_plan, route
from pools.experts.objective import Phase, objective, plain_links
from pools.experts.policies import topology as topology_policy
from pools.model import ReplicaPlacement
from topology import GpuRef

ENV = "ISLE_EXPERT_SPEC"
"""The variable the launcher sets and the plugin reads: the spec's JSON, or `@` and a file holding it."""
LOAD_DIR_ENV = "ISLE_EXPERT_LOAD_DIR"
"""Where the plugin writes each load window vLLM's EPLB hands it (`load.read_load` reads them)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpertSpec:
    domains: tuple[str, ...]
    """Each EP rank's NVLink domain, in EP-rank order."""
    hosts: tuple[str, ...]
    """Each EP rank's host (vLLM's EPLB sees hosts as its nodes)."""
    model: str | None = None
    """The catalogue model that prices a step; None: no step to minimise (`rebalance`)."""
    gpu: str = "h100-sxm"
    carrier: Carrier = "rdma"
    nvlink_gb_s: float = 450.0
    nic_gb_s: float = 50.0
    nic_latency_us: float = 3.0
    phase: Phase = "decode"
    locality: bool = True

    def __post_init__(self) -> None:
        problems = []
        if not self.domains or len(self.domains) != len(self.hosts):
            problems.append(f"{len(self.domains)} domains and {len(self.hosts)} hosts: one of each per EP rank")
        if self.carrier not in get_args(Carrier):
            problems.append(f"carrier {self.carrier!r} is not one of {get_args(Carrier)}")
        if self.phase not in get_args(Phase):
            problems.append(f"phase {self.phase!r} is not one of {get_args(Phase)}")
        if min(self.nvlink_gb_s, self.nic_gb_s) <= 0 or self.nic_latency_us < 0:
            problems.append("link bandwidths must be > 0 and the NIC latency >= 0")
        if self.model is not None:
            try:
                catalog.model(self.model)
            except ValueError:
                problems.append(f"model {self.model!r} is not in the catalogue")
        try:
            catalog.gpu(self.gpu)
        except ValueError:
            problems.append(f"gpu {self.gpu!r} is not in the catalogue")
        if problems:
            raise ValueError(f"{ENV}: " + "; ".join(problems))

    @property
    def ranks(self) -> int:
        return len(self.domains)

    def gang(self) -> Gang:
        return Gang(gpus=tuple(GpuRef(h, k) for k, h in enumerate(self.hosts)), domain=self.domains, host=self.hosts)

    def links(self) -> GangLinks:
        return plain_links(self.gang(), self.carrier, self.nvlink_gb_s, self.nic_gb_s, self.nic_latency_us)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> ExpertSpec:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{ENV}: not JSON ({err.msg})") from None
        if not isinstance(doc, dict):
            raise ValueError(f"{ENV}: want a JSON object")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(doc) - known)
        if unknown:
            raise ValueError(f"{ENV}: unknown keys {unknown} (known: {sorted(known)})")
        try:
            return cls(**{**doc, "domains": tuple(doc.get("domains", ())), "hosts": tuple(doc.get("hosts", ()))})
        except TypeError as err:
            raise ValueError(f"{ENV}: {err}") from None


def spec_from_env(environ: Mapping[str, str]) -> ExpertSpec | None:
    """The spec the launcher set, None when it set none."""
    value = environ.get(ENV, "").strip()
    if not value:
        return None
    if value.startswith("@"):
        try:
            value = Path(value[1:]).read_text()
        except OSError as err:
            raise ValueError(f"{ENV}: cannot read {value[1:]}: {err.strerror}") from None
    return ExpertSpec.from_json(value)


def spec_for(placement: ReplicaPlacement, model: str | None, gpu: str | None = None, *, locality: bool = True,
             gang: Gang | None = None, links: GangLinks | None = None) -> ExpertSpec:
    """The spec of one planned EP gang: its ranks in vLLM's EP order (DP rank, then TP rank), the
    domain and host of each (`gang` from a topology, else the plan's island labels), its links
    (`links`, else NVLink inside a domain and RDMA between), and the model when the catalogue
    knows it as an MoE model (else no step: `rebalance`)."""
    if not placement.members:
        raise ValueError(f"{placement.replica_id}: not a gang (no members)")
    if len({m.pp_stage for m in placement.members}) > 1:
        raise ValueError(f"{placement.replica_id}: expert placement of a pipelined gang is not supported")
    ranked = replace(placement, members=tuple(sorted(placement.members, key=lambda m: m.dp_rank_start)))
    gang = gang or gang_from_plan(ranked)
    links = links or plain_links(gang, "cross-rail" if placement.tier == "rack" else "rdma", 450.0)
    known = catalog.models().get(model) if model else None
    return ExpertSpec(domains=gang.domain, hosts=gang.host, model=model if known is not None and known.moe else None,
                      gpu=gpu or "h100-sxm", carrier=links.carrier, nvlink_gb_s=links.nvlink_gb_s,
                      nic_gb_s=links.nic_gb_s, nic_latency_us=links.nic_latency_us,
                      phase="prefill" if placement.role == "prefill" else "decode", locality=locality)


def _layer_map(phys2log: Sequence[int], ranks: int) -> LayerMap:
    per = len(phys2log) // ranks
    return tuple(tuple(sorted(phys2log[r * per:(r + 1) * per])) for r in range(ranks))


def _slots(layer: LayerMap, old: Sequence[int] | None) -> list[int]:
    """Physical slots, rank by rank; a rank's expert stays in the slot it held in `old`."""
    per = len(layer[0])
    out: list[int] = []
    for r, held in enumerate(layer):
        was = list(old[r * per:(r + 1) * per]) if old is not None else [-1] * per
        todo = list(held)
        slot = [-1] * per
        for j, e in enumerate(was):
            if e in todo:
                slot[j] = e
                todo.remove(e)
        for j in range(per):
            if slot[j] < 0:
                slot[j] = todo.pop(0)
        out += slot
    return out


def rebalance(spec: ExpertSpec, load: Sequence[Sequence[float]], physical: int, groups: int,
              rival: Sequence[Sequence[int]], old: Sequence[Sequence[int]] | None = None) -> list[list[int]]:
    """The physical-to-logical map of every layer (module docstring). `rival`: vLLM's own
    policy's map for the same load (the map returned where it is at least as fast)."""
    if physical % spec.ranks:
        raise ValueError(f"{physical} physical experts do not split over {spec.ranks} EP ranks")
    gang = spec.gang()
    step = None
    if spec.model is not None:
        step = objective(catalog.model(spec.model), catalog.gpu(spec.gpu), spec.links(), spec.ranks, spec.phase)
    out = []
    for k, row in enumerate(load):
        total = float(sum(row))
        shares = [x / total for x in row] if total > 0 else [1.0 / len(row)] * len(row)
        theirs = _layer_map(rival[k], spec.ranks)
        ours = topology_policy(shares, gang, physical, groups, step=step, locality=spec.locality, rival=theirs)
        if step is None:  # no step to compare: keep vLLM's map unless ours is as balanced and more local
            a, b = route(shares, ours, gang, spec.locality), route(shares, theirs, gang, spec.locality)
            if not (a.balancedness >= b.balancedness and a.cross_share < b.cross_share):
                ours = theirs
        if ours == theirs:
            out.append(list(rival[k]))
        else:
            out.append(_slots(ours, old[k] if old is not None else None))
    return out


def local_replicas(phys2log: Sequence[int], domains: Sequence[str], rank: int, experts: int) -> list[list[int]]:
    """Each logical expert's physical slots as `rank` should pick among them (module docstring)."""
    per = len(phys2log) // len(domains)
    mine = domains[rank]
    out: list[list[int]] = [[] for _ in range(experts)]
    for slot, e in enumerate(phys2log):
        if 0 <= e < experts:
            out[e].append(slot)
    return [[p for p in slots if domains[p // per] == mine] or slots for slots in out]


def load_record(load: Sequence[Sequence[float]], **meta: Any) -> dict[str, Any]:
    """What the plugin writes for each load window (`load.read_load` reads `layers`)."""
    return {"layers": [[float(x) for x in row] for row in load], "source": "vllm-eplb", **meta}
