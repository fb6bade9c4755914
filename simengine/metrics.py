"""The engine's /metrics as vLLM 0.32 exports them (vllm/v1/metrics/loggers.py,
`PrometheusStatLogger`): the same names, labels (`model_name`, `engine` = "0") and bucket
boundaries (vllm/v1/metrics/buckets.py), so the router and dashboards scrape a simulated engine
exactly as they scrape vLLM. Latencies are in the engine's virtual seconds (wall seconds at time
scale 1). What vLLM observes when, kept here:

- per step: `vllm:iteration_tokens_total` (prefill tokens + tokens generated), preemptions;
- per token: `vllm:generation_tokens_total`; the first one `vllm:time_to_first_token_seconds`
  (arrival to first token) and `vllm:prompt_tokens_total` (the prompt, as prefilled); every later
  one `vllm:inter_token_latency_seconds` (one gap each: 64 tokens, 63 gaps);
- per finished sequence (streamed or not; one per choice): `vllm:request_success_total`
  {finished_reason: stop, length, abort, error, repetition: the engine's reasons, so a tool call
  is "stop"}, e2e / queue / prefill / decode / inference time, the mean time per output token
  (`vllm:request_time_per_output_token_seconds`, decode time / (tokens - 1)), its prompt and
  generation tokens, preemptions, its max_tokens when the request set one; per prompt, once all
  its n sequences finished, n and the most tokens one of them generated.

Names vLLM 0.32 no longer has are gone: `vllm:gpu_cache_usage_perc` (now
`vllm:kv_cache_usage_perc`), `vllm:time_per_output_token_seconds` (now
`vllm:inter_token_latency_seconds` per gap and `vllm:request_time_per_output_token_seconds` per
request). A request its client abandoned is not counted as finished (vLLM records no stats for
an abort).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0)
TIME_TO_FIRST_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                               10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
INTER_TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                               20.0, 40.0, 80.0)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
REQUEST_PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
REQUEST_NUM_PREEMPTIONS_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
"""vLLM's FinishReason (vllm/v1/engine/__init__.py), every one exported from the start."""
ENGINE = "0"


def request_tokens_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's `build_1_2_5_buckets(max_model_len)`: 1, 2, 5, 10, 20, 50, ... up to it."""
    out: list[float] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_model_len:
                return tuple(out)
            out.append(m * scale)
        scale *= 10


@dataclass(frozen=True, slots=True, kw_only=True)
class Finished:
    """One finished sequence, in virtual seconds."""

    reason: str
    arrival_s: float
    scheduled_s: float
    first_s: float
    last_s: float
    prompt_tokens: int
    generation_tokens: int
    preemptions: int
    max_tokens_param: int | None


class EngineMetrics:
    def __init__(self, model: str, max_model_len: int) -> None:
        self.registry = r = CollectorRegistry()
        self._queries = self._hits = 0
        self.lora_info: Gauge | None = None
        labels, values = ["model_name", "engine"], (model, ENGINE)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=r).labels(*values)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=r).labels(*values)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=r).labels(*values)

        tokens = request_tokens_buckets(max_model_len)
        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prefix_queries = counter("vllm:prefix_cache_queries",
                                      "Prefix cache queries, in terms of number of queried tokens.")
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          [*labels, "finished_reason"], registry=r)
        self.success = {reason: success.labels(*values, reason) for reason in FINISH_REASONS}
        self.request_prompt = histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens)
        self.request_generation = histogram("vllm:request_generation_tokens", "Number of generation tokens processed.",
                                            tokens)
        self.iteration = histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
                                   ITERATION_TOKENS_BUCKETS)
        self.max_generation = histogram("vllm:request_max_num_generation_tokens",
                                        "Histogram of maximum number of requested generation tokens.", tokens)
        self.params_n = histogram("vllm:request_params_n", "Histogram of the n request parameter.",
                                  REQUEST_PARAMS_N_BUCKETS)
        self.params_max_tokens = histogram("vllm:request_params_max_tokens",
                                           "Histogram of the max_tokens request parameter.", tokens)
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              TIME_TO_FIRST_TOKEN_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             INTER_TOKEN_LATENCY_BUCKETS)
        self.tpot = histogram("vllm:request_time_per_output_token_seconds",
                              "Histogram of time_per_output_token_seconds per request.", INTER_TOKEN_LATENCY_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                             REQUEST_LATENCY_BUCKETS)
        self.queue = histogram("vllm:request_queue_time_seconds",
                               "Histogram of time spent in WAITING phase for request.", REQUEST_LATENCY_BUCKETS)
        self.inference = histogram("vllm:request_inference_time_seconds",
                                   "Histogram of time spent in RUNNING phase for request.", REQUEST_LATENCY_BUCKETS)
        self.prefill = histogram("vllm:request_prefill_time_seconds",
                                 "Histogram of time spent in PREFILL phase for request.", REQUEST_LATENCY_BUCKETS)
        self.decode = histogram("vllm:request_decode_time_seconds",
                                "Histogram of time spent in DECODE phase for request.", REQUEST_LATENCY_BUCKETS)
        self.request_preemptions = histogram("vllm:request_num_preemptions",
                                             "Histogram of the number of times a request was preempted.",
                                             REQUEST_NUM_PREEMPTIONS_BUCKETS)

    def lora_state(self, max_loras: int, running: Iterable[str], waiting: Iterable[str]) -> None:
        """vLLM's `vllm:lora_requests_info` (an engine with --enable-lora; vllm/v1/metrics/loggers.py):
        a series per (max_lora, waiting_lora_adapters, running_lora_adapters), the adapters joined
        with commas, set to the time it was last seen."""
        if self.lora_info is None:
            self.lora_info = Gauge("vllm:lora_requests_info", "Running stats on lora requests.",
                                   ["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
                                   registry=self.registry)
        self.lora_info.labels(str(max_loras), ",".join(dict.fromkeys(waiting)),
                              ",".join(dict.fromkeys(running))).set_to_current_time()

    def state(self, running: int, waiting: int, kv_usage: float) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv_usage.set(kv_usage)

    def prefix_totals(self, queries: int, hits: int) -> None:
        """The prefix cache's running totals (tokens queried, tokens hit), as counters."""
        self.prefix_queries.inc(max(0, queries - self._queries))
        self.prefix_hits.inc(max(0, hits - self._hits))
        self._queries, self._hits = max(queries, self._queries), max(hits, self._hits)

    def prompt_finished(self, n: int, most_generated: int) -> None:
        """All `n` sequences of one prompt finished (vLLM's `ParentRequest.observe_finished_request`,
        vllm/v1/engine/parallel_sampling.py): the most tokens one of them generated, and n."""
        self.max_generation.observe(most_generated)
        self.params_n.observe(n)

    def finished(self, f: Finished) -> None:
        """vLLM's `update_from_finished_request` (vllm/v1/metrics/stats.py) and its observations."""
        decode_s = f.last_s - f.first_s
        self.success[f.reason].inc()
        self.e2e.observe(f.last_s - f.arrival_s)
        self.queue.observe(f.scheduled_s - f.arrival_s)
        self.prefill.observe(f.first_s - f.scheduled_s)
        self.inference.observe(f.last_s - f.scheduled_s)
        self.decode.observe(decode_s)
        self.request_preemptions.observe(f.preemptions)
        self.request_prompt.observe(f.prompt_tokens)
        self.request_generation.observe(f.generation_tokens)
        self.tpot.observe(decode_s / (f.generation_tokens - 1) if f.generation_tokens > 1 else 0.0)
        if f.max_tokens_param:
            self.params_max_tokens.observe(f.max_tokens_param)

    def render(self) -> bytes:
        return generate_latest(self.registry)
