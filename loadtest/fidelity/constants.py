"""The cost model's free constants, as the fidelity fit sees them: each one an efficiency or a
fixed cost of one mechanism, where it lives in `physics`, the range a fit may move it in, and the
kinds of published points that inform it. Everything else in the model is a fact with a source
(a data sheet, a config.json, NCCL's tuning tables, a protocol's byte count) and is never fitted.
`decode_mbu` is not free: what a decode step reads at on a part is its measured memory-bound
share times `decode_mbu` times the part's `serving_share`, and only the last is fitted (per part,
from the points on it), so the two cannot trade places.

`applied(values)` evaluates the model under other values of these constants (the leave-one-source-
out fit in `loadtest.fidelity.fit`): it sets them where they live, clears the caches that hold
results computed with the old ones, and puts everything back when it ends. Nothing but the fit
changes them; the product runs on the shipped values (`physics.fitted`: each literal, the prior,
fitted to every published point), and every fit starts from the priors (`priors`).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from physics import fitted


@dataclass(frozen=True, slots=True)
class Free:
    name: str
    where: str
    """module:attribute, with `[key]` for a table entry and `.field` for a field of a frozen
    dataclass (costmodel:DEFAULT.prefill_mfu, collectives:BUS_EFFICIENCY[nvlink],
    a2akernels:KERNELS[pplx].bandwidth_factor)."""
    low: float
    high: float
    kinds: frozenset[str]
    mechanism: str
    kernel: str = ""
    """Only points of this all-to-all kernel move it (a kernel's own factors)."""
    gpu: str = ""
    """Only points on this GPU move it (a part's own factor)."""
    prior: float | None = None
    """Its value when no training point moves it (a kernel's factors: 1, its family's figures);
    None: its literal (`constants.priors`)."""
    needs: str = ""
    """Only points that state this condition move it (an SM budget: `sms`; the network: `network`)."""

    def moves(self, p: dict[str, Any]) -> bool:
        if p["kind"] not in self.kinds or (self.needs and not _stated(p.get(self.needs))):
            return False
        if self.gpu:
            from loadtest.fidelity.fields import names

            return names(p)[1] == self.gpu
        if not self.kernel:
            return True
        from physics.a2akernels import MODE_KERNELS

        name = str(p.get("kernel") or p.get("mode") or "deepep-normal")
        return MODE_KERNELS.get(name, name) == self.kernel


def _stated(value: Any) -> bool:
    return isinstance(value, int | float) or (isinstance(value, str) and not value.lower().startswith("not"))


def _free(name: str, where: str, low: float, high: float, kinds: str, mechanism: str, kernel: str = "",
          gpu: str = "", needs: str = "", prior: float | None = None) -> Free:
    return Free(name, where, low, high, frozenset(kinds.split()), mechanism, kernel, gpu,
                1.0 if kernel or gpu else prior, needs)


def _kernel(name: str) -> tuple[Free, Free]:
    return (_free(f"{name}.bandwidth", f"a2akernels:KERNELS[{name}].bandwidth_factor", 0.1, 3.0, "a2a",
                  f"{name}'s share of the links relative to its family", name),
            _free(f"{name}.latency", f"a2akernels:KERNELS[{name}].latency_factor", 0.1, 10.0, "a2a",
                  f"{name}'s fixed cost relative to its family", name))


def _datasheet_share(gpu: str) -> float:
    """The most a part's `serving_share` can be: memory-bound steps reading at its data sheet's
    bandwidth (`GpuSpec.memory_gb_s` x `decode_mbu` = `hbm_gb_s`), never faster."""
    from physics import catalog, costmodel

    spec = catalog.gpu(gpu)
    share = spec.hbm_share if spec.hbm_share is not None else catalog.HBM_SHARE_DEFAULT
    return 1.0 / (share * costmodel.DEFAULT.decode_mbu)


STEP = "prefill decode pd-ttft pp-prefill moe"
FREE: tuple[Free, ...] = (
    _free("prefill_mfu", "costmodel:DEFAULT.prefill_mfu", 0.3, 0.9, STEP,
          "share of peak BF16 a prefill GEMM reaches"),
    # not attention_mfu (costmodel.DEFAULT.attention_mfu, 0.95): FlashAttention-3's own forward
    # benchmark measures it (`flops.attention_s`), and the serving points that could move it are few
    # and confounded: fitted, it went to its bound (1.0) with SGLang's million-token H20 prompts in,
    # and to its floor (0.4) without them, where vLLM + Mooncake's Qwen3-8B TP8 prefill on H800
    # (1.5-1.7x slower than any share of peak explains) pulled it
    _free("fp8_mfu", "costmodel:DEFAULT.fp8_mfu", 0.25, 0.9, STEP,
          "share of peak FP8/FP4 a low-precision GEMM reaches"),
    _free("decode_mfu", "costmodel:DEFAULT.decode_mfu", 0.1, 0.8, STEP, "share of peak a decode step's GEMMs reach"),
    _free("step_overhead_ms", "costmodel:DEFAULT.step_overhead_ms", 0.1, 6.0, STEP,
          "a decode step's CUDA-graph replay, scheduling and sampling"),
    _free("decode_layer_overhead_ms", "costmodel:DEFAULT.decode_layer_overhead_ms", 0.0001, 0.2, STEP,
          "a decode step's kernels per layer, run one after another"),
    _free("weight_only_dequant_flops", "costmodel:WEIGHT_ONLY_DEQUANT_FLOPS", 0.2, 12.0, STEP,
          "a weight-only GEMV's dequantisation, in operations per weight at the part's FP32 rate"),
    _free("prefill_layer_overhead_ms", "costmodel:DEFAULT.prefill_layer_overhead_ms", 0.01, 0.6, STEP,
          "launches per layer of an eager prefill step"),
    _free("bus_nvlink", "collectives:BUS_EFFICIENCY[nvlink]", 0.5, 0.95, "collective",
          "large-message bus bandwidth over the NVLink line"),
    _free("bus_net", "collectives:BUS_EFFICIENCY[net]", 0.5, 0.98, "collective",
          "large-message bus bandwidth over the NICs' line"),
    _free("nvls_efficiency", "collectives:NVLS_EFFICIENCY", 0.3, 0.95, "collective",
          "NVLS all-reduce's algorithm bandwidth over the NVLink line"),
    _free("launch_us", "collectives:LAUNCH_US", 2.0, 30.0, "collective", "a measured collective's launch and sync"),
    _free("kv_line_efficiency", "kvtransfer:KV_LINE_EFFICIENCY", 0.5, 0.98, "kv pd-ttft",
          "share of a NIC's line a KV transfer engine reaches"),
    _free("kv_setup_ms", "kvtransfer:KV_SETUP_MS", 0.02, 3.0, "kv pd-ttft", "a KV transfer's request and completion"),
    _free("kv_layer_request_us", "kvtransfer:KV_LAYER_REQUEST_US", 0.5, 40.0, "kv pd-ttft",
          "one per-layer K or V transfer request a rank posts to its NIC"),
    _free("pd_path_ms", "predict:VLLM_PD_PATH_MS", 1.0, 80.0, "pd-ttft",
          "what a measured disaggregated serving path adds (its HTTP hops and engine loops)"),
    _free("overlap_efficiency", "moecost:OVERLAP_EFFICIENCY", 0.1, 0.95, "moe",
          "share of the shorter of compute and all-to-all two-batch overlap hides"),
    _free("mla_decode_mfu", "moecost:MLA_DECODE_MFU", 0.3, 0.9, "moe", "MLA decode attention's share of peak"),
    _free("a2a_nvlink_efficiency", "alltoall:A2A_NVLINK_EFFICIENCY", 0.4, 0.95, "a2a moe",
          "share of the NVLink line an all-to-all reaches"),
    _free("a2a_net_efficiency", "alltoall:A2A_NET_EFFICIENCY", 0.4, 0.98, "a2a moe",
          "share of the NIC line an all-to-all reaches"),
    _free("a2a_sm_gb_s", "alltoall:A2A_SM_GB_S", 4.0, 120.0, "a2a", "what one SM moves of an all-to-all's bytes",
          needs="sms"),
    _free("a2a_sm_row_us", "alltoall:A2A_SM_ROW_US", 0.01, 2.0, "a2a",
          "what one token row costs the SM that copies it, apart from its bytes", needs="sms"),
    _free("a2a_net_round_trips", "alltoall:A2A_NET_ROUND_TRIPS", 0.5, 30.0, "a2a",
          "network round trips a call waits on, each at the network's latency beyond RDMA's", needs="network"),
    _free("a2a_proxy_message_us", "alltoall:A2A_PROXY_MESSAGE_US", 0.05, 5.0, "a2a moe",
          "one write a host proxy thread posts for a kernel on a NIC the GPU cannot drive (EFA)",
          needs="network", prior=0.0),
    _free("a2a_latency_us", "alltoall:A2A_LATENCY_US", 5.0, 120.0, "a2a moe",
          "one dispatch or combine call's fixed cost"),
    # not a2a_nvlink_latency_us (alltoall.A2A_NVLINK_LATENCY_US): no reference kernel's point is a
    # call inside one NVLink domain, so only the other kernels' points, each with a latency factor of
    # its own, could move it; fitted, it went where the kernel with the most points put it (34 µs,
    # then 53 once MoRI's MI355X SOP was added) and carried that to every kernel held out
    *(_free(f"{gpu}.serving_share", f"catalog:gpus()[{gpu}].serving_share", 0.25, _datasheet_share(gpu), STEP,
            f"what serving engines' memory-bound steps reach on {gpu}", gpu=gpu)
      for gpu in ("a100-sxm4", "h100-sxm", "h200-sxm", "h800-sxm", "h20", "b200", "gb200", "mi300x")),
    # not deepep-v2: the one source that prices it (ADAI-EP-B200) runs it over NCCL GIN's EFA-GDA,
    # which the model prices only as a GPU-initiated kernel on EFA (its round trips); fitted to those
    # points its own factors would carry GIN's cost to every fabric (0.31 of the line), so it runs as
    # DeepEP V1's normal kernels. Its points still inform the shared constants: held out, UCCL-EP
    # (the other EFA source) reads 50 of 67 within 25 % with them in the fit, 45 without
    *(c for name in ("pplx", "nccl", "uccl-ep-normal", "uccl-ep-ll", "hybrid-ep", "mori-ep",
                     "mori-ep-ll", "pplx-garden", "trtllm-nvlink-one-sided") for c in _kernel(name)),
)
CACHED = ("physics.collectives:_collective_us", "physics.costmodel:_decode_step", "physics.moecost:moe_decode",
          "loadtest.fidelity.replay.closedloop:closed_loop", "loadtest.fidelity.replay.distserve:replay")
"""Functions whose caches hold results computed with the constants."""


def _module(free: Free) -> ModuleType | None:
    """The harness's own module for its constants (`predict:`); None: `physics.fitted` finds it."""
    return importlib.import_module("loadtest.fidelity.predict") if free.where.startswith("predict:") else None


def get(free: Free) -> float:
    return fitted.get(free.where, _module(free))


def _set(free: Free, value: float) -> None:
    fitted.put(free.where, value, _module(free))


def _clear() -> None:
    for name in CACHED:
        module, func = name.split(":")
        fn = getattr(importlib.import_module(module), func, None)
        clear = getattr(fn, "cache_clear", None)
        if clear is not None:
            clear()


def defaults() -> dict[str, float]:
    """The values the model runs on (the shipped fit, `physics.fitted`)."""
    return {f.name: get(f) for f in FREE}


def priors() -> dict[str, float]:
    """Each constant's literal, the prior its docstring derives from its sources: where every fit
    starts (`physics.fitted.PRIORS`; a constant no shipped value replaced is its literal now)."""
    return {f.name: fitted.PRIORS.get(f.where, get(f)) for f in FREE}


@contextmanager
def applied(values: Mapping[str, float]) -> Iterator[None]:
    """The model with `values` (by `Free.name`; the rest unchanged) until the block ends."""
    by_name = {f.name: f for f in FREE}
    unknown = set(values) - set(by_name)
    if unknown:
        raise ValueError(f"unknown free constants: {', '.join(sorted(unknown))}")
    before = {name: get(by_name[name]) for name in values}
    try:
        for name, value in values.items():
            _set(by_name[name], value)
        _clear()
        yield
    finally:
        for name, value in before.items():
            _set(by_name[name], value)
        _clear()
