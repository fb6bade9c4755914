"""A closed-loop run of an attention-DP + EP gang under in-flight batching (`physics.moeserving`)."""

from __future__ import annotations

import pytest

from loadtest.fidelity import report as fidelity
from loadtest.fidelity.moepoints import kv_full_batch
from loadtest.fidelity.predict import predict
from physics import catalog, gangqueries
from physics.moeserving import closed_loop_run, mixed_step_ms
from physics.queries import model_spec

pytestmark = pytest.mark.unit

V3 = model_spec("deepseek-v3", "fp8")
H200 = catalog.gpu("h200-sxm")
LINKS = gangqueries.gang_links("nvlink", "h200-sxm", 8, 8, None)


def test_a_prompt_on_one_rank_holds_up_every_rank_for_longer_than_a_decode_step() -> None:
    run = closed_loop_run(V3, H200, 1, 8, LINKS, 128, 1024, 2048, max_num_tokens=1151)
    assert run.prompts_per_step == 1
    # 128 / 2048 prompts a step on each of 8 ranks, each in an iteration of its own
    assert run.prompt_share == pytest.approx(0.5)
    assert run.decode_ms < run.step_ms < run.mixed_ms
    assert run.tokens_per_s_per_gpu == pytest.approx(128 / (run.step_ms / 1e3))


def test_the_prompt_costs_the_gang_more_than_its_share_of_a_decode_step() -> None:
    mixed = mixed_step_ms(V3, H200, 1, 8, LINKS, 1, 1024, 127, 2048)
    alone = closed_loop_run(V3, H200, 1, 8, LINKS, 128, 1024, 2048, max_num_tokens=1151).decode_ms
    assert mixed > alone
    # more ranks sharing the same arrivals per rank: more of the gang's steps wait for a prompt
    wider = closed_loop_run(V3, H200, 1, 16, gangqueries.gang_links("nvlink", "h200-sxm", 16, 16, None), 128, 1024,
                            2048, max_num_tokens=1151)
    assert wider.prompt_share == pytest.approx(1.0)


def test_a_rank_that_cannot_admit_its_prompts_fast_enough_keeps_fewer_in_flight() -> None:
    run = closed_loop_run(V3, H200, 1, 8, LINKS, 256, 1024, 64, max_num_tokens=2048)
    assert run.in_flight == 64  # one prompt a step at most: 64 steps x 1
    # 1127 tokens hold a 1024-token prompt beside 103 decodes: 104 in flight, not 128
    assert closed_loop_run(V3, H200, 1, 8, LINKS, 128, 1024, 2048, max_num_tokens=1127).in_flight == 104
    with pytest.raises(ValueError, match="no chunked prefill"):
        closed_loop_run(V3, H200, 1, 8, LINKS, 128, 1024, 2048, max_num_tokens=1000)


def test_trtllm_bench_max_throughput_rows_are_priced_as_closed_loop_runs() -> None:
    points = {p["id"]: p for p in fidelity.points() if p.get("source_id") == "TRTLLM-DSR1-PERF"}
    for ident in ("trtllm-dsr1-h200-maxtput", "trtllm-dsr1-b200-maxtput-bf16kv"):
        value, why = predict(points[ident])
        assert value is not None, why
        assert value / points[ident]["value"] < 1.6


def test_single_batch_overlap_hides_transfers_not_the_calls_fixed_costs() -> None:
    def step(batch: int, overlap: str | bool) -> dict[str, float]:
        return gangqueries.moe("deepseek-v3", "h20", 1, 16, "decode", "rdma", batch=batch, context=4864,
                               domain_gpus=8, gbps=400, dtype="fp8", kv_dtype="fp8", overlap=overlap)  # type: ignore[arg-type]

    for batch in (1, 48):
        plain, sbo, combine = step(batch, False), step(batch, "sbo"), step(batch, "combine")
        a2a = plain["dispatch_ms"] + plain["combine_ms"]
        assert plain["ms"] - a2a < sbo["ms"] <= plain["ms"]
        assert combine["ms"] <= plain["ms"]
    # at batch 48 the transfers are a real share of the calls; at batch 1 nearly all is fixed cost
    big = 1 - step(48, "sbo")["ms"] / step(48, False)["ms"]
    small = 1 - step(1, "sbo")["ms"] / step(1, False)["ms"]
    assert big > 0.03 > small


def test_a_batch_chosen_to_fill_the_kv_cache_scales_with_the_kv_tokens_a_rank_holds() -> None:
    # SGLang GB200 part II: 1408 sequences fill the KV cache of its FP8-KV, NVFP4 run; its BF16-KV,
    # FP8 run holds about half as many tokens (twice the bytes a token, heavier weights)
    points = {p["id"]: p for p in fidelity.points() if p.get("source_id") == "SGLANG-GB200-P2"}
    fp8 = points["sglang-gb200-p2-decode-fp8"]
    batch = kv_full_batch(fp8, "deepseek-v3", "gb200")
    assert 0.35 * 1408 < batch < 0.5 * 1408
    same = {**fp8, "dtype": "nvfp4", "kv_dtype": "fp8"}
    assert kv_full_batch(same, "deepseek-v3", "gb200") == pytest.approx(1408)
    value, why = predict(fp8)
    assert value is not None, why
    at_stated = predict({**fp8, "batch": 1408})[0]
    assert at_stated is not None and value < at_stated
