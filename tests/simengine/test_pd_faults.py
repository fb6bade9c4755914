"""PD disaggregation between real engine processes (vLLM's proxy protocol), and fault injection."""

from __future__ import annotations

import socket
import time
import urllib.request
from typing import Any

import openai
import pytest

from tests.simengine.test_server import post
from tests.support.clients import openai_client
from tests.support.engines import running_engine

pytestmark = pytest.mark.integration
MODEL = "llama-3.1-70b"
COMMON = ("--model", MODEL, "--gpu", "h100-sxm", "--tp", "4", "--time-scale", "0.05",
          "--topology", "configs/clusters/local-sim.yaml")
PROMPT = "the KV cache moves from prefill to decode " * 400


def pd_request(prefill_url: str, decode_url: str) -> tuple[dict[str, Any], dict[str, Any]]:
    status, first = post(f"{prefill_url}/v1/completions", {
        "model": MODEL, "prompt": PROMPT, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}})
    assert status == 200, first
    params = first["kv_transfer_params"]
    status, second = post(f"{decode_url}/v1/completions", {
        "model": MODEL, "prompt": PROMPT, "max_tokens": 8, "kv_transfer_params": params})
    assert status == 200, second
    return params, second


def test_pd_pays_for_the_path_and_stale_params_fail_cleanly() -> None:
    where = {"p": '{"node": "h100-0", "gpus": [0, 1, 2, 3]}', "d1": '{"node": "h100-0", "gpus": [4, 5, 6, 7]}',
             "d2": '{"node": "h100-1", "gpus": [0, 1, 2, 3]}'}
    with running_engine(*COMMON, "--role", "prefill", "--placement", where["p"]) as p, \
            running_engine(*COMMON, "--role", "decode", "--placement", where["d1"]) as d1, \
            running_engine(*COMMON, "--role", "decode", "--placement", where["d2"]) as d2:
        params, same = pd_request(p.base, d1.base)
        assert params["do_remote_prefill"] and params["remote_port"] == int(p.base.rsplit(":", 1)[1])
        assert params["isle_placement"] == {"node": "h100-0", "gpus": [0, 1, 2, 3]}
        _, cross = pd_request(p.base, d2.base)
        same_ms, cross_ms = same["isle_timing"]["kv_transfer_ms"], cross["isle_timing"]["kv_transfer_ms"]
        print(f"KV transfer of {same['usage']['prompt_tokens']} tokens: same island {same_ms:.2f} ms, "
              f"cross-node {cross_ms:.2f} ms; TTFT {same['isle_timing']['ttft_ms']:.2f} vs "
              f"{cross['isle_timing']['ttft_ms']:.2f} ms")
        assert cross_ms > 5 * same_ms
        assert cross["isle_timing"]["ttft_ms"] > same["isle_timing"]["ttft_ms"]
        # the same params again: the prefill engine no longer holds that KV
        status, err = post(f"{d1.base}/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 4,
                                                         "kv_transfer_params": params})
        assert status == 400 and "stale kv_transfer_params" in err["error"]["message"]
        status, err = post(f"{d1.base}/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 4,
                                                         "kv_transfer_params": {"do_remote_prefill": True}})
        assert status == 400 and "missing remote_engine_id" in err["error"]["message"]
        bad_host = {**params, "remote_host": "10.1.2.3"}
        status, err = post(f"{d1.base}/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 4,
                                                         "kv_transfer_params": bad_host})
        assert status == 400 and "loopback" in err["error"]["message"]


def timing(url: str, max_tokens: int = 6) -> dict[str, float]:
    status, body = post(f"{url}/v1/completions", {"model": "llama-3.1-8b", "prompt": "x " * 200,
                                                  "max_tokens": max_tokens})
    assert status == 200, body
    return body["isle_timing"]  # type: ignore[no-any-return]


def fault(url: str, spec: dict[str, Any]) -> dict[str, Any]:
    status, body = post(f"{url}/admin/faults", spec)
    assert status == 200, body
    return body


def test_faults_slow_stall_refuse_and_crash() -> None:
    with running_engine("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", "2", "--time-scale", "0.05") as e:
        normal = timing(e.base)
        fault(e.base, {"slowdown": 4.0})
        slow = timing(e.base)
        assert slow["tpot_ms"] == pytest.approx(4 * normal["tpot_ms"], rel=0.01)
        fault(e.base, {"clear": True, "link_bandwidth_factor": 1.0})
        fault(e.base, {"link_bandwidth_factor": 0.1})
        degraded = timing(e.base)
        # the TP link at a tenth of its bandwidth: the prefill's all-reduces (MBs) slow it; a batch-1
        # decode step's (8 KB, latency-bound: NCCL's LL protocol) barely notice
        assert degraded["ttft_ms"] > normal["ttft_ms"] * 1.05 and degraded["tpot_ms"] >= normal["tpot_ms"]
        fault(e.base, {"clear": True})
        fault(e.base, {"stall_s": 1.0})
        start = time.monotonic()
        timing(e.base)
        assert time.monotonic() - start >= 0.9
        fault(e.base, {"refuse_connections": True})
        time.sleep(0.2)
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", int(e.base.rsplit(":", 1)[1])), 2):
            pass
    with running_engine("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--time-scale", "0.05") as e:
        status, bad = post(f"{e.base}/admin/faults", {"explode": True})
        assert status == 400 and "unknown fault fields" in bad["error"]["message"]
        fault(e.base, {"crash_after_tokens": 3})
        c = openai_client(e.url, "unused", timeout=10)
        got = []
        with pytest.raises((openai.APIError, openai.APIConnectionError)):
            for ch in c.completions.create(model="llama-3.1-8b", prompt="x", max_tokens=50, stream=True):
                got.append(ch.choices[0].text if ch.choices else "")
        assert len(got) < 50
        assert e.proc.wait(10) == 17
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(f"{e.base}/health", timeout=2)


def test_held_kv_expires_even_when_the_engine_is_blocked() -> None:
    args = ("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--time-scale", "0.05", "--kv-capacity-tokens", "256",
            "--kv-hold-s", "1")
    with running_engine(*args) as e:
        status, _ = post(f"{e.base}/v1/completions", {"model": "llama-3.1-8b", "prompt": "k" * 800, "max_tokens": 1,
                                                      "kv_transfer_params": {"do_remote_decode": True}})
        assert status == 200  # ~200 tokens of KV now held for a decode that never comes
        start = time.monotonic()
        status, body = post(f"{e.base}/v1/completions", {"model": "llama-3.1-8b", "prompt": "x" * 400,
                                                         "max_tokens": 4})
        assert status == 200, body
        assert time.monotonic() - start < 5  # served once the hold expired; the engine did not wedge
        with urllib.request.urlopen(f"{e.base}/metrics", timeout=5) as resp:  # vLLM counts it on the P side
            text = resp.read().decode()
        assert 'vllm:nixl_num_kv_expired_reqs_total{engine="0",model_name="llama-3.1-8b"} 1.0' in text


def test_rejected_faults_change_nothing_and_context_is_enforced() -> None:
    with running_engine("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--time-scale", "0.05") as e:
        for bad in ({"slowdown": -5}, {"slowdown": float("nan")}, {"link_bandwidth_factor": 2}):
            status, _ = post(f"{e.base}/admin/faults", bad)
            assert status == 400
        assert fault(e.base, {})["slowdown"] == 1.0
        # vLLM 0.32 clamps max_tokens to the context left (get_max_tokens) but refuses a prompt
        # longer than the context itself (TokenizeParams, vllm/renderers/params.py)
        status, body = post(f"{e.base}/v1/completions", {"model": "llama-3.1-8b", "prompt": "x" * 600_000,
                                                         "max_tokens": 100_000})
        assert status == 400 and "maximum context length" in body["error"]["message"], body
        assert body["error"]["param"] == "input_tokens"
