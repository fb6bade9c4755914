"""The simulated engine's batching core on virtual time: timing from the cost model, continuous
batching, chunked prefill, priority, preemption, and PD transfer."""

from __future__ import annotations

import pytest

from physics import catalog, costmodel
from physics.costmodel import LinkCost
from simengine.cli import link_of_kind
from simengine.core import EngineConfig, EngineCore

pytestmark = pytest.mark.unit

MODEL, GPU = catalog.model("llama-3.1-8b"), catalog.gpu("h100-sxm")


def engine(link: LinkCost, tp: int = 2, **kw: int) -> EngineCore:
    return EngineCore(EngineConfig(model=MODEL, gpu=GPU, tp=tp, link=link, **kw))  # type: ignore[arg-type]


def run_all(core: EngineCore) -> dict[str, list[float]]:
    """Token times per request (virtual seconds)."""
    times: dict[str, list[float]] = {}
    while core.has_work():
        result = core.step()
        if result is None:
            nxt = core.next_ready_s()
            assert nxt is not None and nxt > core.now
            core.advance_to(nxt)
            continue
        for rid in result.tokens:
            times.setdefault(rid, []).append(result.start_s + result.duration_s)
    return times


def ttft_tpot(times: list[float], arrival: float = 0.0) -> tuple[float, float]:
    return (times[0] - arrival) * 1000, (times[-1] - times[0]) * 1000 / (len(times) - 1)


@pytest.mark.parametrize(("gpu", "inside", "across"), [("h100-sxm", "nvlink", "sys"), ("a100-sxm4", "nvlink", "sys"),
                                                       ("rtx-4090", "node", "sys")])
def test_crossing_sockets_costs_what_the_cost_model_says(gpu: str, inside: str, across: str) -> None:
    g = catalog.gpu(gpu)
    results = {}
    for kind in (inside, across):
        link = link_of_kind(kind, gpu)
        core = EngineCore(EngineConfig(model=MODEL, gpu=g, tp=2, link=link))
        core.add("r", 2000, 64)
        ttft, tpot = ttft_tpot(run_all(core)["r"])
        predicted_ttft = costmodel.prefill_ms(MODEL, g, 2, link, 2000) + costmodel.DEFAULT.step_overhead_ms
        predicted_tpot = costmodel.decode_step_ms(MODEL, g, 2, link, 1, 2032)
        results[kind] = (ttft, tpot, predicted_ttft, predicted_tpot)
    (t_in, p_in, pt_in, pp_in), (t_out, p_out, pt_out, pp_out) = results[inside], results[across]
    print(f"{gpu} tp=2 {inside} -> {across}: TTFT {t_in:.2f} -> {t_out:.2f} ms (x{t_out / t_in:.3f}, model "
          f"x{pt_out / pt_in:.3f}); TPOT {p_in:.3f} -> {p_out:.3f} ms (x{p_out / p_in:.3f}, "
          f"model x{pp_out / pp_in:.3f})")
    assert t_out > t_in and p_out > p_in
    assert t_out / t_in == pytest.approx(pt_out / pt_in, rel=0.10)
    assert p_out / p_in == pytest.approx(pp_out / pp_in, rel=0.10)


def test_throughput_rises_with_concurrency_then_latency_does() -> None:
    link = link_of_kind("nvlink", "h100-sxm")
    rows = []
    for n in (1, 8, 64, 256, 512):
        core = engine(link, max_num_seqs=256)
        for i in range(n):
            core.add(f"r{i}", 512, 128)
        times = run_all(core)
        span = max(t[-1] for t in times.values())
        tpot = sum(ttft_tpot(t)[1] for t in times.values()) / n
        rows.append((n, n * 128 / span, tpot))
        print(f"concurrency {n}: {n * 128 / span:.0f} output tokens/s, mean TPOT {tpot:.2f} ms")
    rates = [r[1] for r in rows]
    assert rates[0] < rates[1] < rates[2] < rates[3]  # batching pays until the sequence limit
    assert rates[4] < rates[3] * 1.10  # past max_num_seqs=256 it cannot go faster
    assert rows[3][2] > rows[0][2]  # bigger batches: slower steps


def test_chunked_prefill_respects_the_token_budget() -> None:
    core = engine(link_of_kind("nvlink", "h100-sxm"), max_num_batched_tokens=1024)
    core.add("long", 5000, 2)
    steps = []
    while core.has_work():
        result = core.step()
        assert result is not None
        steps.append(result.prefill_tokens)
    assert steps[:5] == [1024, 1024, 1024, 1024, 904] and steps[5] == 0


def test_priority_decides_who_waits() -> None:
    core = engine(link_of_kind("nvlink", "h100-sxm"), max_num_seqs=1)
    core.add("batch", 100, 4, priority=2)
    core.add("interactive", 100, 4, priority=0)
    times = run_all(core)
    assert times["interactive"][-1] < times["batch"][0]


def test_kv_exhaustion_preempts_and_everything_finishes() -> None:
    core = engine(link_of_kind("nvlink", "h100-sxm"), kv_capacity_tokens=4096)
    for i in range(8):
        core.add(f"r{i}", 300, 300)
    preempted = 0
    done: set[str] = set()
    while core.has_work():
        result = core.step()
        assert result is not None
        preempted += len(result.preempted)
        done.update(result.finished)
        assert core.free_blocks >= 0
    assert preempted > 0 and done == {f"r{i}" for i in range(8)}
    assert core.free_blocks == core.total_blocks  # nothing leaked
    with pytest.raises(ValueError, match="exceed the KV cache"):
        core.add("huge", 4000, 200)


def test_pd_decode_waits_for_the_transfer_and_held_kv_is_released() -> None:
    link = link_of_kind("nvlink", "h100-sxm")
    prefill = engine(link)
    prefill.add("p", 3000, 1, hold_kv=True)
    run_all(prefill)
    assert prefill.free_blocks < prefill.total_blocks and prefill.release("p") and not prefill.release("p")
    assert prefill.free_blocks == prefill.total_blocks
    firsts = {}
    for name, transfer_s in (("same-island", 0.003), ("cross-node", 0.027)):
        decode = engine(link)
        decode.add("d", 3000, 8, ready_after_s=transfer_s, remote_prefill=True)
        firsts[name] = run_all(decode)["d"][0]
    assert firsts["cross-node"] - firsts["same-island"] == pytest.approx(0.024, abs=1e-6)


def test_a_sequence_stopped_early_frees_its_blocks_and_leaves_the_batch() -> None:
    """EOS or a stop string ends a sequence before max_tokens (vLLM's scheduler: check_stop,
    v1/core/sched/utils.py): `stop` finishes it at once, so the next step batches one fewer and its
    KV blocks are free; n choices are n sequences, admitted in one step."""
    core = engine(link_of_kind("nvlink", "h100-sxm"))
    for k in range(3):
        core.add(f"r-{k}", 100, 50)
    first = core.step()
    assert first is not None and sorted(first.admitted) == ["r-0", "r-1", "r-2"] and len(first.tokens) == 3
    free = core.free_blocks
    core.stop("r-1")
    assert core.num_running == 2 and core.free_blocks > free
    after = core.step()
    assert after is not None and after.decode_seqs == 2 and "r-1" not in after.tokens
    core.stop("r-1")  # again, or for a finished or unknown request: nothing happens
    core.stop("nobody")
    assert core.num_running == 2
