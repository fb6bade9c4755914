"""Workloads: the trace readers on the real traces (../shared/data/traces) and the shipped samples,
rate scaling and time compression, seeded generators, the class mix, prompt text, and errors."""

from __future__ import annotations

import hashlib
import math
import statistics
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadtest.model import TraceRequest
from loadtest.workload import DATA_DIR, NAMED, load_workload, parse_config
from loadtest.workloads import WorkloadError, synthetic, traces, transforms
from loadtest.workloads.prompts import prompt_text
from tests.conftest import shared_path
from wire.prompt import read_prompts
from wire.text import count_tokens

pytestmark = pytest.mark.unit
FULL = {"azure-conv": ("azure_llm_2023_conv.csv", 19366, 3501.7),
        "azure-code": ("azure_llm_2023_code.csv", 8819, 3435.9),
        "mooncake-conversation": ("mooncake_conversation_trace.jsonl", 12031, 3537.0),
        "mooncake-synthetic": ("mooncake_synthetic_trace.jsonl", 3993, 1022.0)}
SAMPLE_ROWS = {"azure-conv": 2000, "azure-code": 2000, "mooncake-conversation": 1000, "mooncake-synthetic": 1000}
MIX = {"interactive": 0.2, "standard": 0.6, "batch": 0.2}
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture
def traces_dir() -> Path:
    return shared_path("traces")


# the real traces and the samples
@pytest.mark.parametrize("name", list(FULL))
def test_full_traces_count_and_span(traces_dir: Path, name: str) -> None:
    filename, rows, span_s = FULL[name]
    w = load_workload(str(traces_dir / filename))
    assert len(w) == rows
    assert w.requests[0].arrival_s == 0.0 and w.span_s == pytest.approx(span_s, abs=0.1)
    assert [r.index for r in w] == list(range(rows))
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(w.requests, w.requests[1:], strict=False))


def test_full_trace_first_rows(traces_dir: Path) -> None:
    conv = load_workload(str(traces_dir / "azure_llm_2023_conv.csv")).requests
    assert (conv[0].prompt_tokens, conv[0].output_tokens, conv[0].prefix_blocks) == (374, 44, ())
    assert conv[1].arrival_s == pytest.approx(50.9951690 - 46.6805900, abs=1e-9)  # 18:15:50.995169 - 18:15:46.68059
    moon = load_workload(str(traces_dir / "mooncake_conversation_trace.jsonl")).requests
    assert (moon[0].prompt_tokens, moon[0].output_tokens) == (6758, 500)
    assert moon[0].prefix_blocks == tuple(range(14)) and moon[0].block_tokens == 512
    assert moon[1].prefix_blocks[:2] == (0, 14)  # the shared first block
    assert all(len(r.prefix_blocks) == math.ceil(r.prompt_tokens / 512) for r in moon)


@pytest.mark.parametrize("name", list(SAMPLE_ROWS))
def test_samples_are_the_leading_rows_byte_for_byte(traces_dir: Path, name: str) -> None:
    sample = (DATA_DIR / NAMED[name][0]).read_bytes()
    full = (traces_dir / FULL[name][0]).read_bytes()
    assert full.startswith(sample) and sample.endswith(b"\n")
    assert load_workload(name).requests == load_workload(str(traces_dir / FULL[name][0]),
                                                         {"max_requests": SAMPLE_ROWS[name]}).requests


@pytest.mark.parametrize("name", list(SAMPLE_ROWS))
def test_named_workloads_read_the_shipped_samples(name: str) -> None:
    w = load_workload(name)
    assert len(w) == SAMPLE_ROWS[name] and Path(w.source).parent == DATA_DIR
    assert w.requests[0].arrival_s == 0.0 and all(r.slo_class == "standard" for r in w)
    readme = (DATA_DIR / "README.md").read_text()
    assert NAMED[name][0] in readme and hashlib.sha256((DATA_DIR / NAMED[name][0]).read_bytes()).hexdigest() in readme
    assert "CC BY 4.0" in readme and "Splitwise" in readme and "Apache License 2.0" in readme


def test_sample_first_rows() -> None:
    conv, code = load_workload("azure-conv").requests, load_workload("azure-code").requests
    assert (conv[0].prompt_tokens, conv[0].output_tokens, code[0].prompt_tokens, code[0].output_tokens) == (
        374, 44, 4808, 10)
    assert code[1].arrival_s == pytest.approx(0.052, abs=1e-9)
    moon = load_workload("mooncake-synthetic").requests[0]
    assert (moon.prompt_tokens, moon.output_tokens, len(moon.prefix_blocks)) == (40160, 6, 79)


def test_sharegpt_first_human_turn_answered_by_gpt() -> None:
    w = load_workload("sharegpt-example", {"seed": 3})
    assert len(w) == 7  # the conversation that opens with gpt has no pair
    text = "Give me three words for fast."
    assert (w.requests[2].prompt_tokens, w.requests[2].output_tokens) == (count_tokens(text),
                                                                          count_tokens("Quick, rapid, swift."))
    slow, fast = load_workload({"trace": "sharegpt-example", "rate": 1}), load_workload(
        {"trace": "sharegpt-example", "rate": 10})
    assert fast.span_s == pytest.approx(slow.span_s / 10)
    roles = '[{"conversations": [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "ok"}]}]'
    assert traces.parse_sharegpt(roles, "x.json") == [(2, 1)]


# rate scaling and time compression
def test_rate_scale_keeps_the_span_and_multiplies_the_requests() -> None:
    base = load_workload("azure-conv")
    for k in (2, 3, 16):
        w = load_workload("azure-conv", {"rate_scale": k})
        assert len(w) == k * len(base)
        assert w.span_s < transforms.span_s(base.requests) and w.span_s > base.span_s * 0.99
        assert w.record()["rate_rps"] == pytest.approx(k * base.record()["rate_rps"], rel=0.01)
    half = load_workload("azure-conv", {"rate_scale": 0.5})
    assert half.requests == tuple(r for r in load_workload("azure-conv", {"time_scale": 0.5}).requests
                                  if r.arrival_s < transforms.span_s(base.requests))
    assert len(half) == pytest.approx(len(base) / 2, rel=0.05)


def test_one_hour_at_16x_is_the_simulator_benchmark_load(traces_dir: Path) -> None:
    w = load_workload({"path": str(traces_dir / "azure_llm_2023_conv.csv"), "rate_scale": 16, "duration_s": 3600})
    assert len(w) == 16 * 19366 and w.span_s < 3600


def test_time_scale_compresses_arrivals_and_keeps_the_count() -> None:
    base = load_workload("azure-code")
    fast = load_workload("azure-code", {"time_scale": 4})
    assert len(fast) == len(base)
    assert [r.arrival_s for r in fast] == pytest.approx([r.arrival_s / 4 for r in base])
    both = load_workload("azure-code", {"time_scale": 2, "rate_scale": 2})
    assert len(both) == 2 * len(base) and both.span_s == pytest.approx(base.span_s / 2, rel=0.01)


def test_rate_scale_copies_get_their_own_prefix_blocks() -> None:
    base = load_workload("mooncake-conversation")
    w = load_workload("mooncake-conversation", {"rate_scale": 2})
    ids = [h for r in base for h in r.prefix_blocks]
    stride = max(ids) + 1
    copies = [r for r in w if min(r.prefix_blocks) >= stride]
    assert len(copies) == len(base)
    scaled = [h for r in w for h in r.prefix_blocks]
    assert len(set(scaled)) == 2 * len(set(ids)) and len(scaled) == 2 * len(ids)  # same share of repeats


def test_truncation_by_duration_and_count() -> None:
    w = load_workload("azure-conv", {"duration_s": 60})
    assert all(r.arrival_s < 60 for r in w) and len(w) == sum(
        1 for r in load_workload("azure-conv") if r.arrival_s < 60)
    assert len(load_workload("azure-conv", {"duration_s": 60, "max_requests": 10})) == 10
    assert len(load_workload("azure-conv", {"max_requests": 5000})) == 2000


# seeds and the class mix
def test_same_seed_same_workload_and_parts_are_independent() -> None:
    spec = "synthetic:gamma,rate=20,cv=2,prompt=lognormal:1000:800,output=uniform:8:64,requests=300"
    a, b = load_workload(spec, {"seed": 5, "class_mix": MIX}), load_workload(spec, {"seed": 5, "class_mix": MIX})
    assert a.requests == b.requests
    c = load_workload(spec, {"seed": 6, "class_mix": MIX})
    assert [r.arrival_s for r in c] != [r.arrival_s for r in a]
    other_output = load_workload(spec.replace("uniform:8:64", "32"), {"seed": 5})
    assert [r.arrival_s for r in other_output] == [r.arrival_s for r in a]  # arrivals do not move


@pytest.mark.parametrize(("n", "mix", "expected"), [
    (30, MIX, {"interactive": 6, "standard": 18, "batch": 6}),
    (7, MIX, {"interactive": 2, "standard": 4, "batch": 1}),  # 1.4 / 4.2 / 1.4: the tie goes to the first
    (10, {"a": 1, "b": 0}, {"a": 10, "b": 0}),
    (3, {"a": 1, "b": 1, "c": 1, "d": 1}, {"a": 1, "b": 1, "c": 1, "d": 0}),
])
def test_class_counts_by_largest_remainder(n: int, mix: dict[str, float], expected: dict[str, int]) -> None:
    assert transforms.class_counts(mix, n) == expected


def test_class_mix_is_exact_and_shuffled() -> None:
    w = load_workload("azure-conv", {"class_mix": MIX})
    assert w.record()["classes"] == {"batch": 400, "interactive": 400, "standard": 1200}
    first = [r.slo_class for r in w.requests[:50]]
    assert len(set(first)) == 3 and first != sorted(first)
    assert [r.slo_class for r in load_workload("azure-conv", {"class_mix": MIX, "seed": 1})] != [
        r.slo_class for r in w]


def test_synthetic_statistics() -> None:
    w = load_workload("synthetic:poisson,rate=50,prompt=lognormal:1000:600,output=uniform:10:30,requests=20000")
    gaps = [b.arrival_s - a.arrival_s for a, b in zip(w.requests, w.requests[1:], strict=False)]
    assert 1 / statistics.fmean(gaps) == pytest.approx(50, rel=0.03)
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, rel=0.05)
    prompts = [r.prompt_tokens for r in w]
    assert statistics.fmean(prompts) == pytest.approx(1000, rel=0.05)
    assert statistics.median(prompts) == pytest.approx(600, rel=0.05)
    assert {r.output_tokens for r in w} == set(range(10, 31))
    bursty = load_workload("synthetic:gamma,rate=50,cv=3,prompt=8,output=8,requests=20000")
    gaps = [b.arrival_s - a.arrival_s for a, b in zip(bursty.requests, bursty.requests[1:], strict=False)]
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(3.0, rel=0.1)
    vllm_style = parse_config("synthetic:gamma,rate=5,burstiness=0.25,requests=1").synthetic
    assert vllm_style is not None and vllm_style.spec(1, 1).cv == pytest.approx(2.0)


def test_synthetic_rate_scale_means_the_same_as_for_traces() -> None:
    base = load_workload("synthetic:constant,rate=10,prompt=64,output=8,requests=100")
    scaled = load_workload("synthetic:constant,rate=10,prompt=64,output=8,requests=100", {"rate_scale": 3})
    assert len(scaled) == 300 and scaled.span_s == pytest.approx(base.span_s, rel=0.01)
    compressed = load_workload("synthetic:constant,rate=10,prompt=64,output=8,requests=100", {"time_scale": 2})
    assert len(compressed) == 100 and compressed.span_s == pytest.approx(base.span_s / 2)
    timed = load_workload("synthetic:constant,rate=10,prompt=64,output=8", {"duration_s": 5})
    assert len(timed) == 50


# prompt text
def test_prompt_text_has_the_prompt_tokens_and_shares_prefix_blocks() -> None:
    for tokens in (3, 17, 512, 5000):
        text = prompt_text(TraceRequest(index=1, arrival_s=0, prompt_tokens=tokens, output_tokens=1), "t")
        # what the engine and the router read it as: one reading (wire.prompt)
        assert read_prompts({"messages": [{"role": "user", "content": text}]})[0].tokens == tokens
        assert text.isascii()
    a = TraceRequest(index=0, arrival_s=0, prompt_tokens=1500, output_tokens=1, prefix_blocks=(0, 1, 2))
    b = TraceRequest(index=1, arrival_s=0, prompt_tokens=1400, output_tokens=1, prefix_blocks=(0, 1, 9))
    ta, tb = prompt_text(a, "t"), prompt_text(b, "t")
    shared = 0
    while shared < min(len(ta), len(tb)) and ta[shared] == tb[shared]:
        shared += 1
    assert 2 * 512 * 4 <= shared < 2 * 512 * 4 + 16  # two blocks of 512 tokens, then they differ
    lone = [prompt_text(TraceRequest(index=i, arrival_s=0, prompt_tokens=400, output_tokens=1), "t") for i in (0, 1)]
    assert zlib.crc32(lone[0][:256].encode()) != zlib.crc32(lone[1][:256].encode())  # the router's prefix hash
    assert prompt_text(a, "run1")[:256] != prompt_text(a, "run2")[:256]


# errors
BAD_INPUTS = [
    ("x.csv", "", "x.csv:1: empty file"),
    ("x.csv", "TIME,ContextTokens,GeneratedTokens\n", "x.csv:1: header 'TIME,ContextTokens,GeneratedTokens' lacks"),
    ("x.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n", "x.csv: no requests after the header"),
    ("x.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10,5\nyesterday,10,5\n",
     "x.csv:3: TIMESTAMP 'yesterday' is not YYYY-MM-DD HH:MM:SS.fffffff"),
    ("x.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10\n", "x.csv:2: 2 fields"),
    ("x.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,0,5\n",
     "x.csv:2: ContextTokens is 0, must be at least 1"),
    ("x.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1,\n',
     "x.jsonl:2: not JSON"),
    ("x.jsonl", '\n{"timestamp": 0, "input_length": 5}\n', "x.jsonl:2: missing output_length"),
    ("x.jsonl", '{"timestamp": -1, "input_length": 5, "output_length": 1}\n', "x.jsonl:1: timestamp is -1"),
    ("x.jsonl", '{"timestamp": 0, "input_length": 5.5, "output_length": 1}\n', "x.jsonl:1: input_length is 5.5"),
    ("x.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": "a"}\n',
     "x.jsonl:1: hash_ids must be a list"),
    ("x.jsonl", "[1, 2]\n", "x.jsonl:1: a line must be a JSON object"),
    ("x.json", '[{"conversations": [{"from": "human", "value": "a"}]},\n oops]', "x.json:2: not JSON"),
    ("x.json", '{"conversations": []}', "x.json: a ShareGPT file is a JSON list"),
    ("x.json", '[{"id": 1}]', 'x.json: conversation [0] has no "conversations" list'),
    ("x.json", '[{"conversations": [{"from": "human"}]}]', "x.json: conversation [0] turn [0] needs string"),
    ("x.json", '[{"conversations": [{"from": "gpt", "value": "a"}]}]', "x.json: no conversation has a human turn"),
]


@pytest.mark.parametrize(("name", "content", "message"), BAD_INPUTS)
def test_malformed_traces_name_the_file_and_line(tmp_path: Path, name: str, content: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(WorkloadError) as err:
        load_workload(str(path))
    assert str(err.value).startswith(f"{tmp_path / name}{message.removeprefix(name)}")
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize(("spec", "message"), [
    ("no-such-trace", "no trace file 'no-such-trace' (named workloads: azure-conv"),
    ("synthetic:poisson,rate=5", "needs a bound"),
    ("synthetic:poisson,rate=5,speed=3", "'speed=3' is not ARRIVAL"),
    ("synthetic:poisson,rate=-5,requests=3", "synthetic.rate: Input should be greater than 0"),
    ("synthetic:poisson,rate=5,cv=2,requests=3", "cv and burstiness shape gamma arrivals, not poisson"),
    ("synthetic:gamma,rate=5,prompt=lognormal:500:800,requests=3", "lognormal mean 500 is below its median 800"),
    ("synthetic:gamma,rate=5,prompt=uniform:9:3,requests=3", "uniform low 9 is above high 3"),
    ("synthetic:gamma,rate=5,output=zipf:3,requests=3", "synthetic.output is 'zipf:3'"),
    ("synthetic:gamma,rate=5,output=0,requests=3", "synthetic.output is '0', must be a whole number >= 1"),
    ({"trace": "azure-conv", "synthetic": {"rate": 1}}, "exactly one of trace, path, synthetic or sessions"),
    ({"trace": "azure-conv", "rate_scale": 0}, "rate_scale: Input should be greater than 0"),
    ({"trace": "azure-conv", "rate": 3}, "rate: a azure trace has its own timestamps"),
    ({"trace": "azure-conv", "class_mix": {"a": -1}}, "class_mix {'a': -1.0} needs weights >= 0"),
    ({"trace": "azure-conv", "speed": 2}, "speed: Extra inputs are not permitted"),
    ({"synthetic": {"rate": 1, "prompt": {"dist": "uniform", "mean": 3}, "requests": 1}}, "unknown key 'mean'"),
])
def test_bad_specs_say_what_is_wrong(spec: str | dict[str, object], message: str) -> None:
    with pytest.raises(WorkloadError) as err:
        load_workload(spec)
    assert message in str(err.value)


def test_scaling_a_trace_that_arrives_at_once_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "burst.jsonl"
    path.write_text('{"timestamp": 5, "input_length": 5, "output_length": 1}\n' * 3)
    assert len(load_workload(str(path))) == 3
    with pytest.raises(WorkloadError, match="no rate to scale"):
        load_workload(str(path), {"rate_scale": 2})


def test_relative_paths_resolve_from_the_scenario_folder() -> None:
    w = load_workload({"path": "azure_llm_2023_code.sample.csv", "max_requests": 3}, base_dir=DATA_DIR)
    assert len(w) == 3 and w.source == str(DATA_DIR / "azure_llm_2023_code.sample.csv")


# properties
pairs = st.tuples(st.integers(1, 500), st.integers(0, 500))
lengths = st.one_of(st.integers(1, 5000).map(str), pairs.map(lambda t: f"uniform:{t[0]}:{t[0] + t[1]}"),
                    pairs.map(lambda t: f"lognormal:{t[0] + t[1]}:{t[0]}"))


@FAST
@given(arrival=st.sampled_from(synthetic.ARRIVALS), rate=st.floats(0.1, 500), cv=st.floats(0.2, 5),
       prompt=lengths, output=lengths, n=st.integers(1, 300), seed=st.integers(0, 2**32))
def test_synthetic_invariants(arrival: str, rate: float, cv: float, prompt: str, output: str, n: int,
                              seed: int) -> None:
    shape = f",cv={cv}" if arrival == "gamma" else ""
    spec = f"synthetic:{arrival},rate={rate}{shape},prompt={prompt},output={output},requests={n},seed={seed}"
    w = load_workload(spec)
    assert len(w) == n and w.requests[0].arrival_s == 0.0
    assert [r.index for r in w] == list(range(n))
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(w.requests, w.requests[1:], strict=False))
    dist = synthetic.length_dist(prompt, "prompt")
    assert all(max(1, dist.low) <= r.prompt_tokens <= dist.high and r.output_tokens >= 1 for r in w)
    assert load_workload(spec).requests == w.requests
    cut = load_workload(spec, {"duration_s": max(w.span_s / 2, 1e-6)})
    assert cut.requests == tuple(r for r in w if r.arrival_s < max(w.span_s / 2, 1e-6))


TICKS_PER_S = 10**7  # the Azure trace's 7 fraction digits
rows = st.lists(st.tuples(st.integers(0, 2 * 86_400 * TICKS_PER_S - 1), st.integers(1, 100_000), st.integers(1, 4000)),
                min_size=1, max_size=60)


@FAST
@given(rows=rows)
def test_azure_reader_round_trips(rows: list[tuple[int, int, int]]) -> None:
    def stamp(ticks: int) -> str:
        day, rest = divmod(ticks, 86_400 * TICKS_PER_S)
        s, frac = divmod(rest, TICKS_PER_S)
        return f"2023-11-{16 + day} {s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}.{frac:07d}"

    text = ["TIMESTAMP,ContextTokens,GeneratedTokens\r\n", *(f"{stamp(t)},{p},{o}\r\n" for t, p, o in rows)]
    got = traces.parse_azure(text, "t.csv")
    first = min(t for t, _, _ in rows)
    assert [(r.prompt_tokens, r.output_tokens) for r in got] == [(p, o) for _, p, o in rows]
    assert [r.arrival_s for r in got] == pytest.approx([(t - first) / TICKS_PER_S for t, _, _ in rows], abs=1e-6)


@FAST
@given(rows=st.lists(st.tuples(st.integers(0, 10**7), st.integers(1, 10**5), st.integers(1, 4000),
                               st.lists(st.integers(0, 10**6), max_size=8)), min_size=2, max_size=60),
       k=st.integers(1, 5))
def test_mooncake_reader_and_integer_rate_scale(rows: list[tuple[int, int, int, list[int]]], k: int) -> None:
    lines = [f'{{"timestamp": {t}, "input_length": {p}, "output_length": {o}, "hash_ids": {ids}}}\n'
             for t, p, o, ids in rows]
    got = transforms.finalize(traces.parse_mooncake(lines, "t.jsonl"))
    first = min(t for t, _, _, _ in rows)
    assert sorted((r.arrival_s, r.prompt_tokens) for r in got) == sorted(((t - first) / 1000, p) for t, p, _, _ in rows)
    if transforms.span_s(got) == 0:
        return
    scaled = transforms.scale_rate(got, k)
    assert len(scaled) == k * len(got)
    assert all(r.arrival_s < transforms.span_s(got) for r in scaled)


@FAST
@given(weights=st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.floats(0, 10), min_size=1),
       n=st.integers(0, 500))
def test_class_counts_add_up_and_stay_within_one(weights: dict[str, float], n: int) -> None:
    if sum(weights.values()) <= 0:
        with pytest.raises(WorkloadError):
            transforms.class_counts(weights, n)
        return
    counts = transforms.class_counts(weights, n)
    assert sum(counts.values()) == n
    total = sum(weights.values())
    assert all(abs(counts[k] - n * w / total) < 1 for k, w in weights.items())
