"""Predicted time to first token on a replica, from the cost model over the replica's own links
(`physics.costmodel`, the same physics the planner, the simulated engine and the simulator use) and
its load as the router sees it. The PD profile prices prefill/decode pairs and the best mixed
replica with these, so both sides of "PD or mixed?" are predicted the same way.

Every input has a source: model and GPU from the catalogue (`FALLBACK_*` when the routing table
does not name them), the TP group's bottleneck from the topology (`costmodel.group_link`), queue
and batch from the engine's scraped `running`/`waiting`/KV usage and the router's own in-flight
count.
"""

from __future__ import annotations

from typing import NamedTuple

from physics import catalog, costmodel
from physics.catalog import GpuSpec, ModelSpec
from physics.costmodel import LinkCost
from pools.routing import ReplicaEndpoint
from router.plugins.model import ReplicaLoad
from topology import GpuRef, Topology

FALLBACK_MODEL = "llama-3.1-8b"
FALLBACK_GPU = "h100-sxm"
"""The cost model's reference when the routing table names no catalogue model or GPU for a
replica: the demo deployment's (configs/local.yaml on configs/clusters/local-sim.yaml). A guess
of the right order; every replica without names gets the same one, so they compare fairly."""
class Hardware(NamedTuple):
    model: ModelSpec
    gpu: GpuSpec
    tp: int
    link: LinkCost
    """The TP group's bottleneck link (the worst among its GPUs)."""
    kv_capacity_tokens: int
    ep: int = 1
    """Data-parallel ranks (of `tp` GPUs each) the model's experts are split over when this is
    (a rank of) an expert-parallel gang (costmodel's `ep`); 1 otherwise."""
    load_ranks: int = 1
    """Ranks the endpoint's load spreads over: a whole gang behind one endpoint reports its
    ranks' requests together (`ep`); one rank of a gang, or a replica: 1."""


_HARDWARE: dict[tuple[int, str, tuple[int, ...], int, str, str, int, bool], tuple[Topology | None, Hardware]] = {}


def hardware(e: ReplicaEndpoint, topology: Topology | None) -> Hardware:
    """What the replica runs on: a function of the (immutable) topology and the endpoint, so
    remembered — a PD decision prices every replica of the model."""
    key = (id(topology), e.node, e.gpus, e.tp, e.catalog_model or "", e.gpu_model or "", e.expert_parallel,
           bool(e.gang))
    found = _HARDWARE.get(key)
    if found is not None and found[0] is topology:
        return found[1]
    model = catalog.models().get(e.catalog_model or "") or catalog.model(FALLBACK_MODEL)
    gpu = catalog.gpus().get(e.gpu_model or "") or catalog.gpu(FALLBACK_GPU)
    tp = max(1, e.tp)
    gpus = max(1, e.expert_parallel) if model.moe is not None else 1  # the GPUs the experts are split over
    ranks = max(1, gpus // tp)
    link = costmodel.group_link(topology, [GpuRef(e.node, g) for g in e.gpus], tp)
    hw = Hardware(model=model, gpu=gpu, tp=tp, link=link,
                  kv_capacity_tokens=max(1, costmodel.kv_capacity_tokens(model, gpu, tp, ep=gpus)), ep=ranks,
                  load_ranks=1 if e.gang else ranks)
    if len(_HARDWARE) > 65536:
        _HARDWARE.clear()
    _HARDWARE[key] = (topology, hw)
    return hw


def prefill_ms(hw: Hardware, tokens: int) -> float:
    return costmodel.prefill_ms(hw.model, hw.gpu, hw.tp, hw.link, tokens, ep=hw.ep)


_STEPS: dict[tuple[int, int], tuple[Hardware, costmodel.DecodeStep]] = {}


def decode_step_ms(hw: Hardware, running: float, kv_usage: float, extra_tokens: int = 0) -> float:
    """One decode step of the replica's batch (`running` sequences over its `load_ranks`, its
    cache `kv_usage` full): `costmodel.decode_step_ms`, its per-batch part remembered per replica.
    An expert-parallel rank's step is priced without its all-to-all (the router has no gang links;
    the ranks of one gang compare alike)."""
    batch = max(1, int(running / hw.load_ranks))
    key = (id(hw), batch)
    found = _STEPS.get(key)
    if found is None or found[0] is not hw:
        if len(_STEPS) > 65536:
            _STEPS.clear()
        found = _STEPS[key] = (hw, costmodel.DecodeStep.of(hw.model, hw.gpu, hw.tp, hw.link, batch, ep=hw.ep))
    return found[1].ms(int(kv_usage * hw.kv_capacity_tokens) + extra_tokens)


def ahead(load: ReplicaLoad) -> float:
    """Prompts a prefill replica will work on before this one (everything open there is prompt
    work). The engine's counts are as of the last scrape and the router's in-flight count is
    live, so the larger of the two."""
    return max(float(load.inflight), load.waiting + load.running)
