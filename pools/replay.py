"""DistServe's vLLM-baseline chatbot benchmark (OPT-13B, ShareGPT, one A100-SXM-80GB) replayed
through the simulated engine (`pools.engine.core`, virtual time), scored as DistServe scores it.

The run being replayed (LLMServe/DistServe @82831f1, Figure 8 upper, OPT-13B ShareGPT panel):

- client evaluation/ae-scripts/e2e/opt-13b-vllm-client.sh:5: 100 prompts at each per-GPU rate
  0.25 ... 3 req/s; evaluation/2-benchmark-serving/2-benchmark-serving.py: numpy and `random`
  seeded with 0 before every rate (219-222, 295, 340-349), Poisson arrivals drawn as
  np.random.gamma(1, 1/rate, 100), request i sent after the first i gaps (42-65), each asking
  for exactly its dataset output length (max_tokens, ignore_eos; 127-138), prompt + output < 2048
  (144, OPT-13B's 2048 positions);
- server evaluation/2-benchmark-serving/2-start-api-server.py:28-32, 55-68: vLLM, TP 1, fp16,
  block size 16, gpu-memory-utilization 0.95, max-num-batched-tokens 16384, max-num-seqs 1024;
  the vLLM is interestingLSY/vllm branch distserve-baseline-vllm (evaluation/README.md:26),
  @a4b2b944: v0.1.7 (vllm/__init__.py) plus a per-step token timestamp (llm_engine.py:360), so
  no chunked prefill: a step that admits prompts runs only them (vllm/core/scheduler.py:126-188),
  the decodes run in the other steps (190-260), preemption recomputes (a 1 % block watermark on
  admission, vllm/core/block_manager.py:65-89); `EngineConfig(chunked_prefill=False)`;
- scoring evaluation/2-benchmark-serving/structs.py:67-68 and plot.ipynb cells 0 and 2:
  TTFT = first token's timestamp - send time, TPOT = (last - first token timestamp) /
  (output_len - 1) (0 for one token), a request attains when TTFT <= 0.25 s AND TPOT <= 0.1 s;
  attainment = the share of the 100 that do.

The workload (pools/data/distserve_opt13b_sharegpt.yaml, whose header cites every number): the
100 (prompt_len, output_len) pairs of DistServe's own measured vLLM runs of the same setup
(@20a1633 alignment data; not Figure 8's exact draw, whose dataset file is unpublished), and
Figure 8's seed-0 arrival gaps, exact. Step times come from `pools.costmodel` through the engine,
with the measured engine's own fixed costs per step (vLLM 0.1.7 driven through Ray; `vllm017_ray`)
in place of the product engine's: derived from DistServe's rate-1 alignment run alone
(`derive_step_overheads`), so its rate-2 run (`alignment`) and the published curve stay tests;
nothing here is tuned to the published curve.

Also here: a closed-loop benchmark (`closed_loop`: C clients sending I-in / O-out requests back
to back, the mean ITL a client such as AIPerf reports), for loaded-system decode points, on an
engine as TensorRT-LLM's defaults set it (`trtllm_config`).
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

from pools import catalog, costmodel
from pools.engine.core import EngineConfig, EngineCore

TTFT_SLO_S = 0.25
TPOT_SLO_S = 0.1
"""DistServe's OPT-13B ShareGPT SLOs (plot.ipynb cell 2, draw_attainment_rate_plot(..., 0.25, 0.1))."""
MAX_NUM_BATCHED_TOKENS = 16384
MAX_NUM_SEQS = 1024
BLOCK_SIZE = 16
GPU_MEMORY_UTILIZATION = 0.95
"""The vLLM server's flags (2-start-api-server.py:63-67)."""
SOURCE = "DISTSERVE"
"""The calibration points (their `source` prefix) this workload replays."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """One request as DistServe's client measures it."""

    prompt_tokens: int
    output_tokens: int
    arrival_s: float
    ttft_s: float
    tpot_s: float
    preemptions: int = 0

    def meets_ttft(self, slo_s: float = TTFT_SLO_S) -> bool:
        return self.ttft_s <= slo_s

    def meets_tpot(self, slo_s: float = TPOT_SLO_S) -> bool:
        return self.tpot_s <= slo_s


@dataclass(frozen=True, slots=True)
class Replay:
    rate_rps: float
    outcomes: tuple[Outcome, ...]

    def attainment(self, ttft_slo_s: float = TTFT_SLO_S, tpot_slo_s: float = TPOT_SLO_S) -> float:
        """The share of requests meeting both SLOs (DistServe's get_attainment, as a fraction)."""
        ok = sum(1 for o in self.outcomes if o.meets_ttft(ttft_slo_s) and o.meets_tpot(tpot_slo_s))
        return ok / len(self.outcomes) if self.outcomes else 0.0

    def misses(self, ttft_slo_s: float = TTFT_SLO_S, tpot_slo_s: float = TPOT_SLO_S) -> dict[str, int]:
        """Requests that miss: only TTFT, only TPOT, both."""
        count: Counter[str] = Counter()
        for o in self.outcomes:
            ttft, tpot = not o.meets_ttft(ttft_slo_s), not o.meets_tpot(tpot_slo_s)
            if ttft or tpot:
                count["both" if ttft and tpot else "ttft" if ttft else "tpot"] += 1
        return {k: count.get(k, 0) for k in ("ttft", "tpot", "both")}


@dataclass(frozen=True, slots=True)
class Measured:
    """One of DistServe's own measured vLLM runs of these requests (its arrivals, not Figure 8's)."""

    rate_rps: float
    source: str
    issue_s: tuple[float, ...]
    ttft_ms: tuple[float, ...]
    tpot_ms: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Workload:
    requests: tuple[tuple[int, int], ...]
    """(prompt_len, output_len), in the order they are sent."""
    unit_intervals: tuple[float, ...]
    """Figure 8's arrival gaps at 1 req/s (numpy RandomState(0).gamma(1, 1, 100))."""
    measured: tuple[Measured, ...]

    def arrivals(self, rate_rps: float, seed: int | None = None) -> tuple[float, ...]:
        """Send times (s) at `rate_rps`: request i after the first i gaps, as DistServe's client.
        seed None: Figure 8's own gaps (seed 0 of numpy's legacy stream) scaled by 1 / rate;
        an int: exponential gaps from Python's `random.Random(seed)` (another Poisson sample)."""
        if rate_rps <= 0:
            raise ValueError(f"rate must be positive, got {rate_rps}")
        n = len(self.requests)
        if seed is None:
            gaps = [g * (1.0 / rate_rps) for g in self.unit_intervals[:n]]
        else:
            rng = random.Random(seed)
            gaps = [rng.expovariate(rate_rps) for _ in range(n)]
        out, t = [], 0.0
        for gap in gaps:
            out.append(t)
            t += gap
        return tuple(out)

    def measured_replay(self, rate_rps: float) -> Replay:
        """A measured run as a `Replay`, to score it the same way."""
        for m in self.measured:
            if m.rate_rps == rate_rps:
                return Replay(rate_rps, tuple(
                    Outcome(p, o, a, ttft / 1000, tpot / 1000)
                    for (p, o), a, ttft, tpot in zip(self.requests, m.issue_s, m.ttft_ms, m.tpot_ms, strict=True)))
        raise KeyError(f"no measured run at {rate_rps} req/s (have {[m.rate_rps for m in self.measured]})")


@lru_cache(maxsize=1)
def workload() -> Workload:
    raw: dict[str, Any] = yaml.safe_load(
        resources.files("pools").joinpath("data/distserve_opt13b_sharegpt.yaml").read_text())
    return Workload(
        requests=tuple((int(p), int(o)) for p, o in raw["requests"]),
        unit_intervals=tuple(float(g) for g in raw["unit_intervals"]),
        measured=tuple(Measured(float(m["rate_rps"]), str(m["source"]), tuple(map(float, m["issue_s"])),
                                tuple(map(float, m["ttft_ms"])), tuple(map(float, m["tpot_ms"])))
                       for m in raw["measured"]))


VLLM017_RAY_DECODE_STEP_MS = 8.19
"""What one decode step of the measured engine (vLLM 0.1.7 driven through Ray: the api_server's
--engine-use-ray --worker-use-ray, 2-start-api-server.py:55-68) costs beyond the cost model's
physics (weights and KV read, all-reduces), on A100-SXM-80GB with OPT-13B. Not a property of
isleserve's engine: only the DistServe replay uses it (`vllm017_ray`).

Procedure (`derive_step_overheads(1.0)`, from DistServe's rate-1 alignment run only,
@20a1633 .../vllm-100-1.exp, pools/data/distserve_opt13b_sharegpt.yaml `measured`): each
request's decode window runs from its first token (issue + TTFT) to its last (+ TPOT x
(output - 1)); over the 28 requests with >= 2 output tokens whose window holds no other
request's first token (no prefill step stalled them), the median of measured TPOT minus the
cost model's decode step without a fixed cost (`costmodel.decode_step_ms`, step_overhead_ms 0)
at the batch and context the measured timelines show at the window's midpoint.

Where it comes from in vLLM 0.1.7 (interestingLSY/vllm@a4b2b944): every step is a Ray call from
the api server to the engine actor (async_llm_engine.py engine_step: `engine.step.remote()`) and
from it to the worker (llm_engine.py step -> _run_workers "execute_model"), runs eagerly (no
CUDA graphs in 0.1.7), samples in a Python loop over sequence groups (model_executor/layers/
sampler.py _sample), detokenizes each sequence (llm_engine.py _decode_sequence) and ships a
RequestOutput per request back through Ray, which the api server turns into one JSON chunk per
request (entrypoints/api_server.py stream_results) before the engine loop's next step
(async_llm_engine.py run_engine_loop's `await asyncio.sleep(0)`).

A constant is the closest `Efficiency` has: the same windows show the cost growing with the
batch, 5.43 + 0.63 ms per sequence (least squares over those 28 requests, batch 1 to 11; at
their median batch, 5, the line gives 8.6 ms, near the median). A per-sequence term
(`Efficiency.seq_overhead_ms`, added per sequence of a step to its fixed cost) would carry it;
the constant under-prices steps of bigger batches (rate >= 2)."""
VLLM017_RAY_PREFILL_STEP_MS = 25.08
"""What a step that prefills costs the measured engine beyond the cost model's physics (as
`VLLM017_RAY_DECODE_STEP_MS`; spread over the model's layers as `prefill_layer_overhead_ms`).

Procedure (`derive_step_overheads(1.0)`, the same rate-1 run): over the 7 requests whose prompt
the cost model prices by the weight read alone (OPT-13B on A100: up to 127 tokens, so the
result does not lean on prefill_mfu) and that did not queue (no other request was waiting or
prefilling between their issue and their first token), the median of measured TTFT minus the
cost model's prefill without a fixed cost, minus the expected wait for the decode step in
flight when they arrived (half that step, at the batch and context the measured timelines show
then, with `VLLM017_RAY_DECODE_STEP_MS`; none when nothing was running): vLLM 0.1.7 adds new
requests only between steps (async_llm_engine.py engine_step). It holds what the client sees
besides the step: the HTTP request and first chunk, the Ray call that adds the request
(`engine.add_request.remote`) and its tokenization (llm_engine.py add_request)."""


@dataclass(frozen=True, slots=True)
class StepOverheads:
    """`derive_step_overheads`' answer: ms per step beyond the cost model, and the requests (their
    index in the workload) each median is taken over."""

    decode_ms: float
    prefill_ms: float
    decode_requests: tuple[int, ...]
    prefill_requests: tuple[int, ...]
    decode_line_ms: tuple[float, float] = (0.0, 0.0)
    """The decode samples' least-squares line against the batch: (ms at batch 0, ms per sequence)."""


@dataclass(frozen=True, slots=True)
class _Span:
    prompt: int
    output: int
    issue_s: float
    first_s: float
    last_s: float
    tpot_s: float

    def context_at(self, t: float) -> float:
        """Tokens in its KV at `t` while it decodes (prompt, then one per TPOT since the first)."""
        return self.prompt + 1 + (min((t - self.first_s) / self.tpot_s, self.output - 1) if self.tpot_s > 0 else 0.0)


def _spans(w: Workload, rate_rps: float) -> list[_Span]:
    m = next((x for x in w.measured if x.rate_rps == rate_rps), None)
    if m is None:
        raise KeyError(f"no measured run at {rate_rps} req/s (have {[x.rate_rps for x in w.measured]})")
    out = []
    for (p, o), a, ttft, tpot in zip(w.requests, m.issue_s, m.ttft_ms, m.tpot_ms, strict=True):
        first = a + ttft / 1000
        out.append(_Span(p, o, a, first, first + tpot / 1000 * (o - 1), tpot / 1000))
    return out


def _decoding_at(spans: list[_Span], t: float, but: int | None = None) -> tuple[int, int]:
    """The batch decoding at `t` in a measured run and the context it reads."""
    active = [s for j, s in enumerate(spans) if j != but and s.first_s <= t <= s.last_s]
    return len(active), int(sum(s.context_at(t) for s in active))


def derive_step_overheads(rate_rps: float = 1.0, model: str = "opt-13b", gpu: str = "a100-sxm4",
                          tp: int = 1) -> StepOverheads:
    """The measured engine's fixed cost per decode step and per prefill step, from one of
    DistServe's measured runs (the procedures: `VLLM017_RAY_DECODE_STEP_MS`,
    `VLLM017_RAY_PREFILL_STEP_MS`)."""
    m, g = catalog.model(model), catalog.gpu(gpu)
    link = costmodel.LOCAL if tp == 1 else costmodel.TP_LINK_FALLBACK
    bare = dataclasses.replace(costmodel.DEFAULT, step_overhead_ms=0.0, prefill_layer_overhead_ms=0.0)
    spans = _spans(workload(), rate_rps)
    decode: list[float] = []
    decode_ids: list[int] = []
    batches: list[int] = []
    for i, s in enumerate(spans):
        if s.output < 2 or any(j != i and s.first_s < x.first_s <= s.last_s for j, x in enumerate(spans)):
            continue
        batch, context = _decoding_at(spans, (s.first_s + s.last_s) / 2)
        decode.append(s.tpot_s * 1000 - costmodel.decode_step_ms(m, g, tp, link, batch, context, bare))
        decode_ids.append(i)
        batches.append(batch)
    decode_ms = statistics.median(decode)
    slope, intercept = statistics.linear_regression(batches, decode) if len(set(batches)) > 1 else (0.0, decode_ms)
    weights_only = costmodel.prefill_ms(m, g, tp, link, 1, bare)
    prefill: list[float] = []
    prefill_ids: list[int] = []
    for i, s in enumerate(spans):
        pure = costmodel.prefill_ms(m, g, tp, link, s.prompt, bare)
        if pure > weights_only * (1 + 1e-9) or any(
                j != i and x.issue_s < s.first_s and x.first_s > s.issue_s for j, x in enumerate(spans)):
            continue
        batch, context = _decoding_at(spans, s.issue_s, but=i)
        wait = (costmodel.decode_step_ms(m, g, tp, link, batch, context, bare) + decode_ms) / 2 if batch else 0.0
        prefill.append((s.first_s - s.issue_s) * 1000 - pure - wait)
        prefill_ids.append(i)
    return StepOverheads(decode_ms, statistics.median(prefill), tuple(decode_ids), tuple(prefill_ids),
                         (intercept, slope))


def vllm017_ray(model: catalog.ModelSpec) -> costmodel.Efficiency:
    """The cost model's efficiencies with the measured engine's step costs (vLLM 0.1.7 + Ray on
    A100; `VLLM017_RAY_DECODE_STEP_MS`, `VLLM017_RAY_PREFILL_STEP_MS`) in place of the product
    engine's: the prefill step's cost spread over `model`'s layers."""
    return dataclasses.replace(costmodel.DEFAULT, step_overhead_ms=VLLM017_RAY_DECODE_STEP_MS,
                               prefill_layer_overhead_ms=VLLM017_RAY_PREFILL_STEP_MS / model.layers)


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


# A closed-loop benchmark: C clients, each sending its next request when the last one ends ----------

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
    (`pools.cost.tp_link_of`), the product's step costs (`costmodel.DEFAULT`)."""
    from pools import cost  # pools.cost is the `cost` command's module; imported late, as fidelity does

    m, g = catalog.model(model), catalog.gpu(gpu)
    if dtype == "fp8":
        m = dataclasses.replace(m, weight_bytes=1)
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
