"""DistServe's benchmark (`loadtest.fidelity.replay.sharegpt`) replayed through the simulated engine
(`simengine.core`, virtual time) configured as DistServe ran its vLLM baseline, scored as
DistServe scores it: the attainment `loadtest.fidelity.report` prices `kind: attainment` points with.

The server being replayed (LLMServe/DistServe @82831f1):
evaluation/2-benchmark-serving/2-start-api-server.py:28-32, 55-68: vLLM, TP 1, fp16, block size
16, gpu-memory-utilization 0.95, max-num-batched-tokens 16384, max-num-seqs 1024; the vLLM is
interestingLSY/vllm branch distserve-baseline-vllm (evaluation/README.md:26), @a4b2b944: v0.1.7
(vllm/__init__.py) plus a per-step token timestamp (llm_engine.py:360), so no chunked prefill: a
step that admits prompts runs only them (vllm/core/scheduler.py:126-188), the decodes run in the
other steps (190-260), preemption recomputes (a 1 % block watermark on admission,
vllm/core/block_manager.py:65-89); `EngineConfig(chunked_prefill=False)`.

Step times come from `physics.costmodel` through the engine, with the measured engine's own fixed
costs per step (vLLM 0.1.7 driven through Ray; `loadtest.fidelity.replay.overheads.vllm017_ray`) in place of
the product engine's: derived from DistServe's rate-1 alignment run alone (`derive_step_overheads`),
so its rate-2 run (`alignment`) and the published curve stay tests; nothing here is tuned to the
published curve.
"""

from __future__ import annotations

import math
from collections import Counter
from functools import lru_cache

from loadtest.fidelity.replay.overheads import vllm017_ray
from loadtest.fidelity.replay.sharegpt import Outcome, Replay, workload
from physics import catalog, costmodel
from simengine.core import EngineConfig, EngineCore

MAX_NUM_BATCHED_TOKENS = 16384
MAX_NUM_SEQS = 1024
BLOCK_SIZE = 16
GPU_MEMORY_UTILIZATION = 0.95
"""The vLLM server's flags (2-start-api-server.py:63-67)."""


def distserve_config(model: str = "opt-13b", gpu: str = "a100-sxm4", tp: int = 1,
                     chunked_prefill: bool = False) -> EngineConfig:
    """The engine as DistServe ran its vLLM baseline (module docstring): the KV cache from the cost
    model at vLLM's gpu_memory_utilization 0.95, the measured engine's step costs (`vllm017_ray`)."""
    m, g = catalog.model(model), catalog.gpu(gpu)
    return EngineConfig(model=m, gpu=g, tp=tp, link=costmodel.LOCAL if tp == 1 else costmodel.TP_LINK_FALLBACK,
                        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS, max_num_seqs=MAX_NUM_SEQS,
                        block_size=BLOCK_SIZE, chunked_prefill=chunked_prefill, efficiency=vllm017_ray(m),
                        kv_capacity_tokens=costmodel.kv_capacity_tokens(m, g, tp, GPU_MEMORY_UTILIZATION))


def run(config: EngineConfig, requests: tuple[tuple[int, int], ...], arrivals: tuple[float, ...],
        rate_rps: float = 0.0) -> Replay:
    """Send `requests` at `arrivals` to one engine, run it in virtual time until all finish.
    A request joins at the first step boundary after it arrives (as in vLLM); pure decode
    stretches between arrivals are fast-forwarded (`EngineCore.decode_run`, step for step the same)."""
    if len(requests) != len(arrivals):
        raise ValueError(f"{len(requests)} requests but {len(arrivals)} arrival times")
    core = EngineCore(config)
    order = sorted(range(len(requests)), key=lambda i: (arrivals[i], i))
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    preempted: Counter[str] = Counter()
    k = 0
    while k < len(order) or core.has_work():
        while k < len(order) and arrivals[order[k]] <= core.now:
            prompt, output = requests[order[k]]
            core.add(str(order[k]), prompt, output)
            k += 1
        nxt = arrivals[order[k]] if k < len(order) else math.inf
        if not core.has_work():
            core.advance_to(nxt)
            continue
        if core.decode_run(nxt) is not None:
            continue
        result = core.step()
        if result is None:
            if math.isinf(nxt):
                raise RuntimeError("the engine holds requests it can never run")
            core.advance_to(nxt)
            continue
        end = result.start_s + result.duration_s
        for rid in result.tokens:
            first.setdefault(rid, end)
        for rid in result.finished:
            last[rid] = end
        preempted.update(result.preempted)
    outcomes = []
    for i, (prompt, output) in enumerate(requests):
        rid = str(i)
        tpot = (last[rid] - first[rid]) / (output - 1) if output > 1 else 0.0
        outcomes.append(Outcome(prompt, output, arrivals[i], first[rid] - arrivals[i], tpot, preempted[rid]))
    return Replay(rate_rps, tuple(outcomes))


@lru_cache(maxsize=256)
def replay(rate_rps: float, model: str = "opt-13b", gpu: str = "a100-sxm4", tp: int = 1,
           seed: int | None = None, chunked_prefill: bool = False) -> Replay:
    """DistServe's workload at `rate_rps` (per GPU) on the engine configured as its vLLM baseline."""
    w = workload()
    return run(distserve_config(model, gpu, tp, chunked_prefill), w.requests, w.arrivals(rate_rps, seed), rate_rps)


def predicted_attainment(model: str, gpu: str, tp: int, rate_rps: float) -> float:
    return replay(rate_rps, model, gpu, tp).attainment()


@lru_cache(maxsize=4)
def alignment(rate_rps: float) -> tuple[Replay, Replay]:
    """One of DistServe's measured runs of the workload and the engine's replay of the same
    requests at that run's own issue times: (measured, replayed)."""
    w = workload()
    run_ = next((m for m in w.measured if m.rate_rps == rate_rps), None)
    if run_ is None:
        raise KeyError(f"no measured run at {rate_rps} req/s (have {[m.rate_rps for m in w.measured]})")
    return w.measured_replay(rate_rps), run(distserve_config(), w.requests, run_.issue_s, rate_rps)
