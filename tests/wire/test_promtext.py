"""wire.promtext on vLLM 0.32's /metrics text: gauges and counters by name and labels,
histograms as sum, count and buckets, the load the router and the replicas read, and text that
is not Prometheus refused."""

from __future__ import annotations

import pytest

from router.state import parse_vllm_metrics
from simengine.metrics import EngineMetrics, Finished
from wire.promtext import LOAD, EngineLoad, Histogram, MetricsError, engine_load, parse

pytestmark = pytest.mark.unit

# as vLLM 0.32 (PrometheusStatLogger) writes it, two data-parallel engines of one model
VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.25
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1234.0
vllm:prompt_tokens_total{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 766.0
# HELP vllm:prompt_tokens_created Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_created gauge
vllm:prompt_tokens_created{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.7501e+09
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 9.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 10.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 10.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.5
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.001",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="1.0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
vllm:time_to_first_token_seconds_count{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
vllm:time_to_first_token_seconds_sum{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.5
# HELP vllm:time_to_first_token_seconds_created Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds_created gauge
vllm:time_to_first_token_seconds_created{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.7501e+09
"""
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def test_gauges_and_counters_by_name_and_labels() -> None:
    scrape = parse(VLLM)
    assert scrape.value("vllm:num_requests_running") == 4.0
    assert scrape.value("vllm:num_requests_running", engine="0") == 3.0
    assert scrape.value("vllm:num_requests_running", engine="1", model_name=MODEL) == 1.0
    assert scrape.value("vllm:num_requests_running", model_name="other") is None
    assert scrape.value("vllm:prompt_tokens_total") == 2000.0  # samples keep their own names
    assert scrape.value("vllm:request_success_total", finished_reason="stop") == 7.0
    assert scrape.mean("vllm:kv_cache_usage_perc") == 0.375
    assert scrape.total("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:absent") == 6.0
    assert scrape.value("vllm:absent") is None


def test_histograms_add_up_over_engines_or_one_by_its_label() -> None:
    scrape = parse(VLLM)
    assert scrape.histogram("vllm:time_to_first_token_seconds") == Histogram(
        sum=3.0, count=12.0, buckets=((0.001, 1.0), (0.1, 5.0), (1.0, 11.0), (float("inf"), 12.0)))
    one = scrape.histogram("vllm:time_to_first_token_seconds", engine="1")
    assert one is not None and one.count == 2.0 and one.sum == 0.5 and one.buckets[-1] == (float("inf"), 2.0)
    assert scrape.histogram("vllm:inter_token_latency_seconds") is None


def test_only_the_named_metrics_are_kept_and_read_the_same() -> None:
    names = ("vllm:num_requests_running", "vllm:time_to_first_token_seconds")
    kept = parse(VLLM, names)
    assert set(kept.samples) == {"vllm:num_requests_running", "vllm:time_to_first_token_seconds_bucket",
                                 "vllm:time_to_first_token_seconds_count", "vllm:time_to_first_token_seconds_sum",
                                 "vllm:time_to_first_token_seconds_created"}
    whole = parse(VLLM)
    assert kept.histogram(names[1]) == whole.histogram(names[1])
    assert kept.value(names[0], engine="0") == whole.value(names[0], engine="0")
    assert parse(VLLM, ("vllm:nothing",)).samples == {}


def test_the_load_of_data_parallel_engines() -> None:
    assert engine_load(VLLM) == EngineLoad(running=4.0, waiting=2.0, kv_usage=0.375)
    assert engine_load(VLLM).busy == 6.0
    assert parse_vllm_metrics(VLLM) == {"running": 4.0, "waiting": 2.0, "kv_usage": 0.375}


def test_an_older_vllm_kv_gauge_and_missing_gauges() -> None:
    old = ('# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{model_name="m"} 0.8\n'
           'vllm:num_requests_running{model_name="m"} 1\n')
    assert engine_load(old) == EngineLoad(running=1.0, waiting=None, kv_usage=0.8)
    assert parse_vllm_metrics(old) == {"running": 1.0, "kv_usage": 0.8}
    assert engine_load("") == EngineLoad() and engine_load("").busy == 0.0
    assert parse_vllm_metrics("# nothing here\n") == {}


def test_the_simulated_engine_reads_as_vllm() -> None:
    metrics = EngineMetrics("llama-3.1-8b", 8192)
    metrics.state(running=5, waiting=3, kv_usage=0.6)
    metrics.ttft.observe(0.05)
    metrics.finished(Finished(reason="stop", arrival_s=0.0, scheduled_s=0.1, first_s=0.2, last_s=1.2, prompt_tokens=8,
                              generation_tokens=11, preemptions=0, max_tokens_param=None))
    text = metrics.render().decode()
    assert engine_load(text) == EngineLoad(running=5.0, waiting=3.0, kv_usage=0.6)
    scrape = parse(text)
    ttft = scrape.histogram("vllm:time_to_first_token_seconds", engine="0", model_name="llama-3.1-8b")
    assert ttft is not None and ttft.count == 1.0 and ttft.sum == pytest.approx(0.05)
    assert dict(ttft.buckets)[0.06] == 1.0 and dict(ttft.buckets)[0.04] == 0.0
    assert scrape.value("vllm:request_success_total", finished_reason="stop") == 1.0
    assert parse(text, LOAD).samples.keys() == {"vllm:num_requests_running", "vllm:num_requests_waiting",
                                                "vllm:kv_cache_usage_perc"}


@pytest.mark.parametrize("text", ['vllm:num_requests_running{engine="0" 1\n', "vllm:x{a=\"b\"} not-a-number\n",
                                  "<html>502 Bad Gateway</html>\n"])
def test_text_that_is_not_prometheus_is_refused(text: str) -> None:
    with pytest.raises(MetricsError):
        parse(text)


def test_a_broken_load_line_is_refused_and_other_lines_are_not_read() -> None:
    with pytest.raises(ValueError):
        parse_vllm_metrics('vllm:num_requests_running{engine="0"} many\n')
    assert parse_vllm_metrics('<html>\nvllm:num_requests_waiting 2\n') == {"waiting": 2.0}
