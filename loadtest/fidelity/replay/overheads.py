"""The measured engine's fixed costs per step beyond the cost model's physics (vLLM 0.1.7 driven
through Ray, on A100-SXM-80GB with OPT-13B): the constants DistServe's replay prices its steps with
(`vllm017_ray`) and the procedure that derives them from DistServe's rate-1 measured run alone
(`derive_step_overheads`, over `loadtest.fidelity.replay.sharegpt`'s measured timelines). Not a property of
isleserve's engine.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass

from loadtest.fidelity.replay.sharegpt import Workload, workload
from physics import catalog, costmodel

VLLM017_RAY_DECODE_STEP_MS = 10.03
"""What one decode step of the measured engine (vLLM 0.1.7 driven through Ray: the api_server's
--engine-use-ray --worker-use-ray, 2-start-api-server.py:55-68) costs beyond the cost model's
physics (weights and KV read, all-reduces), on A100-SXM-80GB with OPT-13B. Not a property of
isleserve's engine: only the DistServe replay uses it (`vllm017_ray`).

Procedure (`derive_step_overheads(1.0)`, from DistServe's rate-1 alignment run only,
@20a1633 .../vllm-100-1.exp, physics/data/distserve_opt13b_sharegpt.yaml `measured`): each
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

The same windows show the cost growing with the batch: the replay prices the line, not the
median (`VLLM017_RAY_DECODE_BASE_MS`, `VLLM017_RAY_DECODE_SEQ_MS`)."""
VLLM017_RAY_DECODE_BASE_MS = 7.14
VLLM017_RAY_DECODE_SEQ_MS = 0.66
"""The decode step's cost beyond the physics as a line in the batch: 7.14 ms + 0.66 ms per
sequence (least squares over the same 28 requests, batch 1 to 11; at their median batch, 5, 10.4
ms, near the median), `Efficiency.step_overhead_ms` and `seq_overhead_ms` of the replay: the
sampling loop, detokenization and the RequestOutput each sequence costs (above) grow with the
batch, so a constant under-prices the bigger batches of rates >= 2."""
VLLM017_RAY_PREFILL_STEP_MS = 25.63
"""What a step that prefills costs the measured engine beyond the cost model's physics (as
`VLLM017_RAY_DECODE_STEP_MS`; spread over the model's layers as `prefill_layer_overhead_ms`).

Procedure (`derive_step_overheads(1.0)`, the same rate-1 run): over the 7 requests whose prompt's
GEMMs the cost model bounds by their weight read, their compute below it (OPT-13B on A100: up to
125 tokens; `costmodel.step_roofs`: through the roofline's corner such a prompt still moves with
prefill_mfu, at most half as fast as a compute-bound one), and that did not
queue (no other request was waiting or prefilling between their issue and their first token), the
median of measured TTFT minus the cost model's prefill without a fixed cost, minus the expected
wait for the decode step in flight when they arrived (half that step, at the batch and context the
measured timelines show then, with `VLLM017_RAY_DECODE_STEP_MS`; none when nothing was running):
vLLM 0.1.7 adds new requests only between steps (async_llm_engine.py engine_step). It holds what
the client sees besides the step: the HTTP request and first chunk, the Ray call that adds the
request (`engine.add_request.remote`) and its tokenization (llm_engine.py add_request)."""


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
    prefill: list[float] = []
    prefill_ids: list[int] = []
    for i, s in enumerate(spans):
        pure = costmodel.prefill_ms(m, g, tp, link, s.prompt, bare)
        compute_s, weights_s = costmodel.step_roofs(m, g, tp, ((max(s.prompt, 1), 0),), 0, 0, bare)
        # GEMMs bound by the weight read (their compute below it): prefill_mfu moves them at most half as much
        if compute_s > weights_s or any(
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
    A100; `VLLM017_RAY_DECODE_BASE_MS` and `_SEQ_MS`, `VLLM017_RAY_PREFILL_STEP_MS`) in place of the product
    engine's: the prefill step's cost spread over `model`'s layers."""
    return dataclasses.replace(costmodel.DEFAULT, step_overhead_ms=VLLM017_RAY_DECODE_BASE_MS,
                               seq_overhead_ms=VLLM017_RAY_DECODE_SEQ_MS,
                               prefill_layer_overhead_ms=VLLM017_RAY_PREFILL_STEP_MS / model.layers)
