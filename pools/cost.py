"""`python -m pools cost prefill|decode|collective|kv ... --format json`: what the cost model (the
one the planner, the simulated engine and the simulator use) predicts, as one JSON object with
the inputs echoed and the link it assumed. Pure: each answer is a function of its inputs.

Links are the topology defaults of each kind (`topology.kinds.DEFAULTS`: bandwidth per GPU and
direction, latency, and their sources); `--gbps` replaces the bandwidth of a network link with
a NIC rate in Gbit/s. A TP group's link defaults to NVSwitch (placement keeps TP inside an
NVLink island). `--dtype fp8` stores the weights in one byte (the memory a step reads); the
catalogue has no FP8 compute rates yet, so FP8 compute runs at the BF16 rate (`fp8_compute`
says so in the answer).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pools import catalog, costmodel
from pools.catalog import ModelSpec
from topology import LinkKind, Path
from topology.kinds import DEFAULTS
from topology.paths import Tier

LINKS: dict[str, LinkKind] = {
    "nvswitch": LinkKind.NVSWITCH, "nvlink": LinkKind.NVLINK, "xgmi": LinkKind.XGMI, "pcie": LinkKind.PIX,
    "sys": LinkKind.SYS, "rdma": LinkKind.RDMA, "tcp": LinkKind.TCP}
"""`--link` names and the link kind each prices (pcie: GPUs under one PCIe switch)."""
NETWORK = frozenset({"rdma", "tcp"})
KV_LINKS: dict[str, Tier] = {"nvlink": "nvlink", "pcie": "pcie", "rdma": "rdma", "tcp": "tcp"}
"""`cost kv --link` names and the tier each path is (nvlink: the NVSwitch default)."""
OPS = ("allreduce", "allgather", "reducescatter", "alltoall")
DTYPES = ("bf16", "fp8")


def link(name: str, gbps: float | None = None) -> costmodel.LinkCost:
    """The default link of kind `name`; `gbps` (Gbit/s, a NIC's rate) replaces its bandwidth."""
    if name not in LINKS:
        raise ValueError(f"unknown link {name!r} (known: {', '.join(LINKS)})")
    if gbps is not None and gbps <= 0:
        raise ValueError(f"--gbps must be positive, got {gbps}")
    d = DEFAULTS[LINKS[name]]
    return costmodel.LinkCost(bandwidth_gb_s=gbps / 8 if gbps is not None else d.bandwidth_gb_s,
                              latency_us=d.latency_us)


def _link_view(name: str, cost: costmodel.LinkCost) -> dict[str, Any]:
    return {"name": name, "bandwidth_gb_s": cost.bandwidth_gb_s, "latency_us": cost.latency_us}


def _model(name: str, dtype: str) -> ModelSpec:
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
    model = catalog.model(name)
    return replace(model, weight_bytes=1) if dtype == "fp8" else model


def _positive(**values: int) -> None:
    for key, value in values.items():
        if value < 1:
            raise ValueError(f"--{key} must be at least 1, got {value}")


def _fits(model: ModelSpec, gpu_name: str, tp: int) -> bool:
    """Weights plus one long request's KV fit `tp` GPUs of this kind (answered, not enforced: a
    check may ask for a layout that would not be served)."""
    return costmodel.fits(model, catalog.gpu(gpu_name).memory_gb, tp)


def prefill(model: str, gpu: str, tp: int, tokens: int, context: int = 0, dtype: str = "bf16",
            link_name: str = "nvswitch") -> dict[str, Any]:
    """A prefill of `tokens` new tokens after `context` cached ones, on TP=`tp`."""
    _positive(tp=tp, tokens=tokens)
    if context < 0:
        raise ValueError(f"--context must be 0 or more, got {context}")
    spec, tp_link = _model(model, dtype), link(link_name)
    ms = costmodel.prefill_ms(spec, catalog.gpu(gpu), tp, tp_link, tokens, context_tokens=context)
    return {"what": "prefill", "model": model, "gpu": gpu, "tp": tp, "tokens": tokens, "context": context,
            "dtype": dtype, "link": _link_view(link_name, tp_link), "fits": _fits(spec, gpu, tp),
            "fp8_compute": "bf16 rate" if dtype == "fp8" else None, "ms": ms}


def decode(model: str, gpu: str, tp: int, batch: int, context: int, dtype: str = "bf16",
           link_name: str = "nvswitch") -> dict[str, Any]:
    """One decode step of `batch` sequences with `context` tokens of context each."""
    _positive(tp=tp, batch=batch)
    if context < 0:
        raise ValueError(f"--context must be 0 or more, got {context}")
    spec, tp_link = _model(model, dtype), link(link_name)
    ms = costmodel.decode_step_ms(spec, catalog.gpu(gpu), tp, tp_link, batch, batch * context)
    return {"what": "decode", "model": model, "gpu": gpu, "tp": tp, "batch": batch, "context": context,
            "dtype": dtype, "link": _link_view(link_name, tp_link), "fits": _fits(spec, gpu, tp),
            "fp8_compute": "bf16 rate" if dtype == "fp8" else None, "ms": ms}


def collective(op: str, size_bytes: int, gpus: int, link_name: str, gpu: str | None = None,
               gbps: float | None = None) -> dict[str, Any]:
    """One collective of `size_bytes` per GPU (as nccl-tests counts its size) over `gpus` GPUs
    (`costmodel.collective_ms`)."""
    if op not in OPS:
        raise ValueError(f"unknown collective {op!r} (known: {', '.join(OPS)})")
    _positive(bytes=size_bytes, gpus=gpus)
    if gbps is not None and link_name not in NETWORK:
        raise ValueError(f"--gbps is a network rate: it goes with --link rdma or tcp, not {link_name}")
    if gpu is not None:
        catalog.gpu(gpu)  # a name the catalogue knows (the link prices the collective)
    cost = link(link_name, gbps)
    ms = costmodel.collective_ms(op, size_bytes, gpus, cost)
    return {"what": "collective", "op": op, "bytes": size_bytes, "gpus": gpus, "gpu": gpu, "gbps": gbps,
            "link": _link_view(link_name, cost), "us": ms * 1e3}


def kv(model: str, tokens: int, link_name: str, gbps: float | None = None) -> dict[str, Any]:
    """Moving the KV cache of `tokens` tokens of `model` between two replicas over one link."""
    _positive(tokens=tokens)
    if link_name not in KV_LINKS:
        raise ValueError(f"--link for a KV transfer is nvlink, pcie, rdma or tcp, not {link_name!r}")
    if gbps is not None and link_name not in NETWORK:
        raise ValueError(f"--gbps is a network rate: it goes with --link rdma or tcp, not {link_name}")
    spec = catalog.model(model)
    kind = LinkKind.NVSWITCH if link_name == "nvlink" else LINKS[link_name]
    cost = link("nvswitch" if link_name == "nvlink" else link_name, gbps)
    path = Path(kind=kind, tier=KV_LINKS[link_name], bandwidth_gb_s=cost.bandwidth_gb_s, latency_us=cost.latency_us,
                via=f"one {link_name} link")
    ms = costmodel.kv_transfer_ms(spec, tokens, path)
    return {"what": "kv", "model": model, "tokens": tokens, "gbps": gbps, "kv_bytes": costmodel.kv_bytes(spec, tokens),
            "link": _link_view(link_name, cost), "ms": ms}
