"""The decode engine's KV reads in vLLM 0.32's NIXL metrics, and the KV-transfer faults that
slow or fail them (issue 34): real engine processes on loopback, vLLM's proxy protocol."""

from __future__ import annotations

import time
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from physics import catalog, kvtransfer
from physics.kvpath import NO_FAULT, KvPathFault
from simengine import nixlmetrics
from simengine.pd import Placement, kv_paths
from tests.simengine.conftest import post
from tests.support.engines import fault, running_engine
from topology import read_source

pytestmark = pytest.mark.integration
MODEL = "llama-3.1-8b"
TOPOLOGY = "configs/clusters/local-sim.yaml"
COMMON = ("--model", MODEL, "--gpu", "h100-sxm", "--tp", "2", "--time-scale", "0.05", "--topology", TOPOLOGY)
WHERE = {"p": Placement(node="h100-0", gpus=(0, 1)), "d": Placement(node="h100-0", gpus=(2, 3))}
PROMPT = "the KV cache moves from prefill to decode " * 1000


def _json(p: Placement) -> str:
    return f'{{"node": "{p.node}", "gpus": [{p.gpus[0]}, {p.gpus[1]}]}}'


def pd_request(prefill: str, decode: str, max_tokens: int = 4) -> tuple[int, dict[str, Any]]:
    status, first = post(f"{prefill}/v1/completions", {
        "model": MODEL, "prompt": PROMPT, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}})
    assert status == 200, first
    return post(f"{decode}/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": max_tokens,
                                             "kv_transfer_params": first["kv_transfer_params"]})


def scrape(base: str) -> dict[str, Any]:
    """name -> (type, {sample name + sorted labels: value})."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, Any] = {}
    for fam in text_string_to_metric_families(text):
        out[fam.name] = (fam.type, {(s.name, tuple(sorted(s.labels.items()))): s.value for s in fam.samples})
    return out


def value(metrics: dict[str, Any], family: str, sample: str, **labels: str) -> float:
    return float(sum(v for (name, lab), v in metrics[family][1].items()
                     if name == sample and all(dict(lab).get(k) == x for k, x in labels.items())))


def expected_ms(tokens: int, fault: KvPathFault = NO_FAULT) -> float:
    paths = kv_paths(read_source(TOPOLOGY), WHERE["p"], WHERE["d"])
    return fault.handover_ms(catalog.model(MODEL), tokens, paths)


def test_nixl_metrics_and_kv_faults_follow_the_cost_model() -> None:
    with running_engine(*COMMON, "--role", "prefill", "--placement", _json(WHERE["p"]), "--engine-id", "pf-0") as p, \
            running_engine(*COMMON, "--role", "decode", "--placement", _json(WHERE["d"])) as d:
        before = scrape(d.base)
        for name, kind in (("vllm:nixl_xfer_time_seconds", "histogram"), ("vllm:nixl_post_time_seconds", "histogram"),
                           ("vllm:nixl_bytes_transferred", "histogram"), ("vllm:nixl_num_descriptors", "histogram"),
                           ("vllm:nixl_num_failed_transfers", "counter"),
                           ("vllm:nixl_num_failed_notifications", "counter"),
                           ("vllm:nixl_num_kv_expired_reqs", "counter"),
                           ("vllm:nixl_num_notifications_after_expiry", "counter")):
            assert before[name][0] == kind, name  # registered from the start, as vLLM's with a connector
            labels = {k for (_, lab) in before[name][1] for k, _ in lab} - {"le"}
            assert labels == {"model_name", "engine"}, (name, labels)
        buckets = sorted(float(dict(lab)["le"]) for (n, lab) in before["vllm:nixl_xfer_time_seconds"][1]
                         if n.endswith("_bucket"))
        assert tuple(buckets[:-1]) == nixlmetrics.XFER_TIME_BUCKETS

        status, body = pd_request(p.base, d.base)
        assert status == 200, body
        tokens, ms = body["usage"]["prompt_tokens"], body["isle_timing"]["kv_transfer_ms"]
        assert ms == pytest.approx(expected_ms(tokens), rel=1e-3)
        time.sleep(0.2)
        m = scrape(d.base)
        kv_bytes = kvtransfer.kv_bytes(catalog.model(MODEL), tokens)
        # one transfer per decode TP rank (vLLM's per-worker telemetry), each its shard, each the handover
        assert value(m, "vllm:nixl_xfer_time_seconds", "vllm:nixl_xfer_time_seconds_count") == 2
        assert value(m, "vllm:nixl_xfer_time_seconds", "vllm:nixl_xfer_time_seconds_sum") == \
            pytest.approx(2 * ms / 1000, rel=1e-3)
        assert value(m, "vllm:nixl_bytes_transferred", "vllm:nixl_bytes_transferred_sum") == \
            pytest.approx(kv_bytes, rel=1e-6)
        assert value(m, "vllm:nixl_num_descriptors", "vllm:nixl_num_descriptors_sum") == 2 * 2 * 32 * -(-tokens // 16)
        assert value(m, "isle_engine_kv_transfer_seconds", "isle_engine_kv_transfer_seconds_count",
                     remote_engine_id="pf-0") == 1
        assert value(m, "isle_engine_kv_transfer_bytes", "isle_engine_kv_transfer_bytes_total",
                     remote_engine_id="pf-0") == pytest.approx(kv_bytes, rel=1e-6)

        fault(d, {"kv_transport": "tcp", "kv_peer": "pf-0"})  # the pair falls back to TCP
        status, tcp = pd_request(p.base, d.base)
        assert status == 200, tcp
        tcp_ms = tcp["isle_timing"]["kv_transfer_ms"]
        assert tcp_ms == pytest.approx(expected_ms(tokens, KvPathFault(transport="tcp")), rel=1e-3)
        assert tcp_ms > 10 * ms and tcp["isle_timing"]["ttft_ms"] > body["isle_timing"]["ttft_ms"] + 0.9 * (tcp_ms - ms)
        fault(d, {"kv_transport": "default", "kv_bandwidth_factor": 0.5, "kv_peer": "pf-0"})  # remote NIC
        status, half = pd_request(p.base, d.base)
        assert status == 200, half
        assert half["isle_timing"]["kv_transfer_ms"] == pytest.approx(expected_ms(tokens, KvPathFault(
            bandwidth_factor=0.5)), rel=1e-3)
        fault(d, {"kv_peer": "someone-else", "kv_transport": "tcp"})  # another peer's fault changes nothing here
        time.sleep(0.2)
        m = scrape(d.base)
        assert value(m, "isle_engine_kv_transfer_seconds", "isle_engine_kv_transfer_seconds_sum",
                     remote_engine_id="pf-0") == pytest.approx((ms + tcp_ms + half["isle_timing"]["kv_transfer_ms"])
                                                               / 1000, rel=1e-3)

        fault(d, {"clear": True})
        fault(d, {"kv_fail_rate": 1.0})  # vLLM's default kv_load_failure_policy "fail": a 500
        status, err = pd_request(p.base, d.base)
        assert status == 500 and err["error"]["type"] == "InternalServerError", err
        m = scrape(d.base)
        assert value(m, "vllm:nixl_num_failed_transfers", "vllm:nixl_num_failed_transfers_total") == 1
        assert value(m, "vllm:request_success", "vllm:request_success_total", finished_reason="error") == 1
        assert value(m, "isle_engine_kv_transfer_failures", "isle_engine_kv_transfer_failures_total",
                     remote_engine_id="pf-0") == 1


def test_a_failed_read_is_recomputed_under_the_recompute_policy() -> None:
    with running_engine(*COMMON, "--role", "prefill", "--placement", _json(WHERE["p"])) as p, \
            running_engine(*COMMON, "--role", "decode", "--placement", _json(WHERE["d"]),
                           "--kv-load-failure-policy", "recompute") as d:
        status, good = pd_request(p.base, d.base)
        assert status == 200, good
        fault(d, {"kv_fail_rate": 1.0})
        status, again = pd_request(p.base, d.base)
        assert status == 200, again
        # the failed read's time, then the whole prefill on the decode engine
        assert again["isle_timing"]["ttft_ms"] > good["isle_timing"]["ttft_ms"] + 20
        time.sleep(0.2)
        m = scrape(d.base)
        assert value(m, "vllm:nixl_num_failed_transfers", "vllm:nixl_num_failed_transfers_total") == 1
        assert value(m, "vllm:nixl_xfer_time_seconds", "vllm:nixl_xfer_time_seconds_count") == 2
        status, bad = post(f"{d.base}/admin/faults", {"kv_fail_rate": 2})
        assert status == 400, bad
