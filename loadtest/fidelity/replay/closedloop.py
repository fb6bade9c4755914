"""A closed-loop benchmark: C clients, each sending its next request when the last one ends
(`closed_loop`: I-in / O-out requests back to back, the mean ITL a client such as AIPerf reports),
for loaded-system decode points, on an engine as TensorRT-LLM's defaults set it (`trtllm_config`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from functools import lru_cache

from physics import catalog, costmodel
from simengine.core import EngineConfig, EngineCore

TRTLLM_MAX_NUM_TOKENS = 8192
"""TensorRT-LLM's default token budget per step (trtllm-serve --max_num_tokens, default 8192)."""
TRTLLM_MAX_BATCH_SIZE = 256
"""... and requests per step (--max_batch_size, default 256)."""
TRTLLM_FREE_GPU_MEMORY_FRACTION = 0.9
"""KvCacheConfig.free_gpu_memory_fraction default: the KV cache takes 90 % of the memory left after
the weights and buffers (buffers: the cost model's 2 GB activation reserve)."""
TRTLLM_TOKENS_PER_BLOCK = 32
"""KvCacheConfig.tokens_per_block default."""
# NIM 1.8 runs TensorRT-LLM with in-flight batching; NIM-BENCH states none of its engine settings, so
# the closed loop uses TensorRT-LLM's defaults above, and its default capacity scheduler,
# GUARANTEED_NO_EVICT ("guarantee that a started request is never paused": a request starts only
# when the KV of its whole prompt and output fits beside those of the running ones; TensorRT-LLM
# performance tuning guide, Useful Runtime Options, Capacity Scheduler Policy).


def trtllm_config(model: str, gpu: str, tp: int, dtype: str = "bf16", link: str = "nvswitch") -> EngineConfig:
    """An engine as TensorRT-LLM's defaults set it (constants above): chunked prefill (in-flight
    batching of prompt chunks with decodes), FP8 weights for dtype fp8, the TP group over `link`
    (`physics.queries.tp_link_of`), the product's step costs (`costmodel.DEFAULT`)."""
    from physics import (
        queries as cost,  # physics.queries is the `cost` command's module; imported late, as fidelity does
    )

    m, g = catalog.model(model), catalog.gpu(gpu)
    if dtype == "fp8":
        m = m.with_dtypes("fp8")
    free_gb = (g.memory_gb - costmodel.weights_per_gpu_gb(m, tp) - 2.0) * TRTLLM_FREE_GPU_MEMORY_FRACTION
    capacity = max(0, int(free_gb * 1e9 * tp / m.kv_bytes_per_token()))
    return EngineConfig(model=m, gpu=g, tp=tp, link=costmodel.LOCAL if tp == 1 else cost.tp_link_of(link, gpu, tp),
                        max_num_batched_tokens=TRTLLM_MAX_NUM_TOKENS, max_num_seqs=TRTLLM_MAX_BATCH_SIZE,
                        block_size=TRTLLM_TOKENS_PER_BLOCK, kv_capacity_tokens=capacity, chunked_prefill=True)


@dataclass(frozen=True, slots=True)
class ClientRequest:
    """One request of a closed-loop run, as a benchmark client (AIPerf, genai-perf) times it."""

    client: int
    sent_s: float
    ttft_s: float
    e2e_s: float
    output_tokens: int

    @property
    def itl_s(self) -> float:
        """Inter-token latency: (request latency - TTFT) / (output tokens - 1)."""
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1) if self.output_tokens > 1 else 0.0


@dataclass(frozen=True, slots=True)
class ClosedLoop:
    concurrency: int
    input_tokens: int
    output_tokens: int
    requests: tuple[ClientRequest, ...]
    """The measured requests (each client's after its warm-up ones), in the order they finished."""
    steps: int
    virtual_s: float
    complete: bool
    """False: a bound (steps, virtual time) stopped the run before every measured request finished."""

    def mean_itl_ms(self) -> float:
        return 1000 * statistics.fmean(r.itl_s for r in self.requests) if self.requests else math.nan

    def mean_ttft_ms(self) -> float:
        return 1000 * statistics.fmean(r.ttft_s for r in self.requests) if self.requests else math.nan


def closed_loop(config: EngineConfig, concurrency: int, input_tokens: int, output_tokens: int,
                warmup_per_client: int = 2, measured_per_client: int = 4, max_steps: int = 200_000,
                max_virtual_s: float = 36_000.0, reserve_whole_request: bool = True) -> ClosedLoop:
    """`concurrency` clients each send requests of `input_tokens` in and exactly `output_tokens`
    out back to back (the next the moment the last one's final token arrives), all starting at 0,
    through one engine in virtual time, until `concurrency x measured_per_client` requests past
    each client's first `warmup_per_client` have finished. The warm-up ones are not measured (they
    start together; later ones are spread out by the engine itself), and the clients never stop
    sending while it runs, so nothing measured runs in a draining engine: steady state.
    `reserve_whole_request`: a request starts only when the KV of its prompt and output fits
    beside the started ones' (TensorRT-LLM's GUARANTEED_NO_EVICT); otherwise the engine's own
    admission (vLLM's: the prompt's blocks, and preemption when decodes run out). Stops early
    (`complete` False) after `max_steps` engine steps or `max_virtual_s`."""
    if concurrency < 1 or input_tokens < 1 or output_tokens < 1 or measured_per_client < 1 or warmup_per_client < 0:
        raise ValueError("need concurrency, input and output tokens and measured requests per client >= 1")
    core = EngineCore(config)
    capacity = core.total_blocks * config.block_size
    need = math.ceil((input_tokens + output_tokens) / config.block_size) * config.block_size
    pending: list[tuple[str, int, int, float]] = []  # (rid, client, k, sent_s), first come first served
    started: dict[str, tuple[int, int, float]] = {}
    first: dict[str, float] = {}
    done: list[ClientRequest] = []
    reserved = 0
    steps = 0
    for c in range(concurrency):
        pending.append((f"{c}.0", c, 0, 0.0))
    measured_left = concurrency * measured_per_client
    while measured_left > 0 and steps < max_steps and core.now < max_virtual_s:
        while pending and (not reserve_whole_request or reserved + need <= capacity or not core.has_work()):
            rid, c, k, sent = pending.pop(0)
            core.add(rid, input_tokens, output_tokens)
            started[rid] = (c, k, sent)
            reserved += need
        plan = core.decode_run(max_virtual_s, max_steps - steps)
        if plan is not None:
            steps += plan.steps
            continue
        result = core.step()
        if result is None:
            raise RuntimeError("the engine holds requests it can never run")
        steps += 1
        end = result.start_s + result.duration_s
        for rid in result.tokens:
            first.setdefault(rid, end)  # a preempted request's recompute is a stall its client waits out
        for rid in result.finished:
            c, k, sent = started.pop(rid)
            reserved -= need
            if k >= warmup_per_client and measured_left > 0:
                done.append(ClientRequest(c, sent, first[rid] - sent, end - sent, output_tokens))
                measured_left -= 1
            pending.append((f"{c}.{k + 1}", c, k + 1, end))
    return ClosedLoop(concurrency, input_tokens, output_tokens, tuple(done), steps, core.now, measured_left == 0)


@lru_cache(maxsize=64)
def closed_loop_itl_ms(model: str, gpu: str, tp: int, concurrency: int, input_tokens: int, output_tokens: int,
                       dtype: str = "bf16", link: str = "nvswitch") -> float:
    """The mean ITL a benchmark client reports for a closed loop on a TensorRT-LLM-default engine
    (`trtllm_config`, `closed_loop`)."""
    loop = closed_loop(trtllm_config(model, gpu, tp, dtype, link), concurrency, input_tokens, output_tokens)
    if not loop.complete:
        raise RuntimeError(f"the closed loop did not reach its measured requests in {loop.steps} steps, "
                           f"{loop.virtual_s:.0f} s")
    return loop.mean_itl_ms()
