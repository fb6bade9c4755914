"""The LoRA workload (`loadtest.workloads.lora`, a workload spec's `lora:`): requests name adapters,
Zipf over them, seeded; the live driver sends each request's own model."""

from __future__ import annotations

from collections import Counter

import orjson
import pytest

from loadtest.live.run import Driver
from loadtest.model import TraceRequest
from loadtest.workload import load_workload
from loadtest.workloads import WorkloadError
from loadtest.workloads.lora import AdapterMix, assign_adapters

pytestmark = pytest.mark.unit
SPEC = {"synthetic": {"arrival": "poisson", "rate": 50, "prompt": 64, "output": 8, "requests": 2000},
        "lora": {"adapters": 4, "skew": 1.0}, "seed": 3}


def test_requests_name_adapters_zipf_over_them() -> None:
    workload = load_workload(SPEC)
    counts = Counter(r.model for r in workload)
    assert set(counts) == {"lora-0", "lora-1", "lora-2", "lora-3"}
    share = [counts[f"lora-{k}"] / 2000 for k in range(4)]
    expected = [1 / (k + 1) / sum(1 / (j + 1) for j in range(4)) for k in range(4)]  # 0.48, 0.24, 0.16, 0.12
    assert share == pytest.approx(expected, abs=0.03)
    assert [r.model for r in load_workload(SPEC)] == [r.model for r in workload]  # seeded
    assert [r.index for r in workload] == list(range(2000))  # renumbering keeps the names


def test_a_base_share_and_named_adapters() -> None:
    reqs = [TraceRequest(index=i, arrival_s=i, prompt_tokens=8, output_tokens=2) for i in range(1000)]
    got = assign_adapters(reqs, AdapterMix(adapters=("sql", "chat"), skew=0.0, base_share=0.5), seed=1)
    counts = Counter(r.model for r in got)
    assert counts[""] == pytest.approx(500, abs=60) and counts["sql"] == pytest.approx(250, abs=50)
    with pytest.raises(WorkloadError):
        AdapterMix(adapters=("a", "a"))


class _Target:
    pass


def test_the_live_driver_sends_a_requests_adapter() -> None:
    workload = load_workload({**SPEC, "max_requests": 3})
    driver = Driver(_Target(), workload, "llama-3.1-8b", "key", timeout_s=5.0)  # type: ignore[arg-type]
    req = next(iter(workload))
    assert orjson.loads(driver.body(req))["model"] == req.model
    base = TraceRequest(index=0, arrival_s=0, prompt_tokens=8, output_tokens=2)
    assert orjson.loads(driver.body(base))["model"] == "llama-3.1-8b"
