"""The engine's /metrics with vLLM's own metric names, so the router scrapes a simulated engine
exactly as it scrapes vLLM. Latencies are in the engine's virtual seconds (wall seconds at
time scale 1)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                   20.0, 40.0, 80.0)


class EngineMetrics:
    def __init__(self, model: str) -> None:
        self.registry = CollectorRegistry()
        r, labels = self.registry, ["model_name"]
        self.running = Gauge("vllm:num_requests_running", "Requests in the running batch", labels, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled", labels, registry=r)
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage (1 = full)", labels, registry=r)
        self.gpu_cache = Gauge("vllm:gpu_cache_usage_perc", "KV-cache usage, pre-0.10 name", labels, registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token", labels,
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Inter-token latency", labels,
                             buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("vllm:time_per_output_token_seconds", "Time per output token", labels,
                              buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency", labels,
                             buckets=LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens processed", labels, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated", labels, registry=r)
        self.preemptions = Counter("vllm:num_preemptions", "Requests preempted", labels, registry=r)
        self.success = Counter("vllm:request_success", "Finished requests", [*labels, "finished_reason"],
                               registry=r)
        self.model = model
        # cached children: .labels() costs more than the observation itself
        self.c_running, self.c_waiting = self.running.labels(model), self.waiting.labels(model)
        self.c_kv, self.c_gpu_cache = self.kv_usage.labels(model), self.gpu_cache.labels(model)
        self.c_ttft, self.c_itl, self.c_tpot = self.ttft.labels(model), self.itl.labels(model), self.tpot.labels(model)
        self.c_e2e = self.e2e.labels(model)
        self.c_prompt, self.c_gen = self.prompt_tokens.labels(model), self.generation_tokens.labels(model)
        self.c_preempt = self.preemptions.labels(model)

    def state(self, running: int, waiting: int, kv_usage: float) -> None:
        self.c_running.set(running)
        self.c_waiting.set(waiting)
        self.c_kv.set(kv_usage)
        self.c_gpu_cache.set(kv_usage)

    def render(self) -> bytes:
        return generate_latest(self.registry)
