"""`python -m pools cost ...`: what the cost model predicts, as the contract independent checks
call it (one JSON object on stdout, the inputs echoed; exit 2 with one line for bad input)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from physics import catalog, queries
from pools.__main__ import main

pytestmark = pytest.mark.unit
MODELS = ("llama-2-7b", "llama-2-70b", "llama-3.1-8b", "llama-3.1-70b", "llama-3.3-70b", "llama-3.1-405b", "opt-13b",
          "opt-66b", "qwen3-8b", "qwen3-32b", "qwen2.5-32b", "mixtral-8x7b", "deepseek-v3")


def cost(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["cost", *args, "--format", "json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    answer: dict[str, Any] = json.loads(out[0])
    return answer


@pytest.mark.parametrize("model", MODELS)
def test_every_listed_model_answers_prefill_decode_and_kv(capsys: pytest.CaptureFixture[str], model: str) -> None:
    for gpu in ("h100-sxm", "a100-sxm4", "h200-sxm", "b200"):
        pre = cost(capsys, "prefill", "--model", model, "--gpu", gpu, "--tp", "8", "--tokens", "1024")
        assert pre["model"] == model and pre["gpu"] == gpu and pre["tp"] == 8 and pre["tokens"] == 1024
        # the weights as priced: the model's own format (DeepSeek-V3 ships FP8) unless --dtype says otherwise
        assert pre["context"] == 0 and pre["dtype"] == queries.dtype_of(catalog.model(model)) and pre["ms"] > 0
        dec = cost(capsys, "decode", "--model", model, "--gpu", gpu, "--tp", "8", "--batch", "16", "--context", "2048")
        assert (dec["batch"], dec["context"]) == (16, 2048) and dec["ms"] > 0
    kv = cost(capsys, "kv", "--model", model, "--tokens", "1000", "--link", "rdma")
    assert kv["kv_bytes"] == catalog.model(model).kv_bytes_per_token() * 1000 and kv["ms"] > 0


def test_prefill_grows_with_tokens_and_cached_context(capsys: pytest.CaptureFixture[str]) -> None:
    base = ("prefill", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", "1")
    short, long = (cost(capsys, *base, "--tokens", n)["ms"] for n in ("128", "4096"))
    after = cost(capsys, *base, "--tokens", "4096", "--context", "16384")
    assert short < long < after["ms"] and after["context"] == 16384


def test_decode_reads_weights_and_context(capsys: pytest.CaptureFixture[str]) -> None:
    base = ("decode", "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "--tp", "4", "--batch", "8")
    small, big = (cost(capsys, *base, "--context", c)["ms"] for c in ("128", "32768"))
    fp8 = cost(capsys, *base, "--context", "128", "--dtype", "fp8")
    assert small < big and fp8["ms"] < small and fp8["dtype"] == "fp8"  # half the weight bytes to read


def test_collectives_by_op_size_group_and_link(capsys: pytest.CaptureFixture[str]) -> None:
    def us(op: str, size: int, gpus: int, link: str, *extra: str) -> float:
        answer = cost(capsys, "collective", "--op", op, "--bytes", str(size), "--gpus", str(gpus), "--link", link,
                      *extra)
        assert (answer["op"], answer["bytes"], answer["gpus"], answer["link"]["name"]) == (op, size, gpus, link)
        return float(answer["us"])

    for op in ("allreduce", "allgather", "reducescatter", "alltoall"):
        assert 0 < us(op, 1 << 20, 8, "nvswitch") < us(op, 1 << 28, 8, "nvswitch") < us(op, 1 << 28, 8, "pcie")
    assert us("allreduce", 1 << 28, 8, "nvswitch") > us("allgather", 1 << 28, 8, "nvswitch")  # twice the bytes
    assert us("allreduce", 1 << 26, 16, "rdma", "--gbps", "400") < us("allreduce", 1 << 26, 16, "rdma", "--gbps", "100")


def test_kv_over_each_link_and_nic_rate(capsys: pytest.CaptureFixture[str]) -> None:
    def ms(link: str, *extra: str) -> float:
        return float(cost(capsys, "kv", "--model", "llama-3.1-70b", "--tokens", "8192", "--link", link, *extra)["ms"])

    assert ms("nvlink") < ms("pcie") < ms("tcp")
    assert ms("rdma", "--gbps", "400") < ms("rdma", "--gbps", "100")


@pytest.mark.parametrize(("gpu", "model", "as_gpu", "as_model"), [
    ("H100", "meta-llama/Llama-3.1-70B-Instruct", "h100-sxm", "llama-3.1-70b"),
    ("NVIDIA H100 80GB HBM3", "Meta-Llama-3.1-70B-Instruct", "h100-sxm", "llama-3.1-70b"),  # NVML's name
    ("A100-SXM4-80GB", "meta-llama/Llama-2-70b-chat-hf", "a100-sxm4", "llama-2-70b"),
    ("NVIDIA H800", "Qwen/Qwen3-8B", "h800-sxm", "qwen3-8b"),
    ("H100 NVL", "Qwen/Qwen3-32B", "h100-nvl", "qwen3-32b"),
    ("AMD Instinct MI300X", "mistralai/Mixtral-8x7B-Instruct-v0.1", "mi300x", "mixtral-8x7b"),
    ("GB200 NVL72", "deepseek-ai/DeepSeek-R1-0528", "gb200", "deepseek-v3"),
])
def test_parts_and_models_by_the_names_people_and_tools_write(capsys: pytest.CaptureFixture[str], gpu: str,
                                                              model: str, as_gpu: str, as_model: str) -> None:
    """A user writes `--gpu H100 --model meta-llama/Llama-3.1-70B-Instruct`: the answer is the
    catalogue's part and model, and names them, exactly as if the catalogue's names were given."""
    args = ("--tp", "8", "--tokens", "2048")
    answer = cost(capsys, "prefill", "--model", model, "--gpu", gpu, *args)
    assert (answer["gpu"], answer["model"]) == (as_gpu, as_model)
    assert answer == cost(capsys, "prefill", "--model", as_model, "--gpu", as_gpu, *args)


def test_choices_in_any_case_and_in_vllms_and_ncclss_words(capsys: pytest.CaptureFixture[str]) -> None:
    """`--link NVLink`, `--op all_reduce` (nccl-tests' name), `--dtype bfloat16` and
    `--kv-dtype fp8_e4m3` (vLLM's) answer as the catalogue's lower-case words do."""
    def answer(*args: str) -> dict[str, Any]:
        return cost(capsys, *args)

    assert answer("collective", "--op", "all_reduce", "--bytes", "1048576", "--gpus", "8", "--link", "NVSwitch") == \
        answer("collective", "--op", "allreduce", "--bytes", "1048576", "--gpus", "8", "--link", "nvswitch")
    base = ("decode", "--model", "qwen3-8b", "--gpu", "h100-sxm", "--tp", "1", "--batch", "8", "--context", "1000")
    assert answer(*base, "--dtype", "BFloat16", "--kv-dtype", "fp8_e4m3") == \
        answer(*base, "--dtype", "bf16", "--kv-dtype", "fp8")
    assert answer(*base, "--kv-dtype", "auto")["kv_dtype"] == "bf16"
    moe = ("moe", "--model", "deepseek-v3", "--gpu", "h100-sxm", "--dp", "16", "--batch", "64", "--gbps", "400")
    assert answer(*moe, "--phase", "Decode", "--link", "RDMA") == answer(*moe, "--phase", "decode", "--link", "rdma")


def test_an_amd_gang_runs_over_its_infinity_fabric_by_that_name(capsys: pytest.CaptureFixture[str]) -> None:
    """`cost moe --gpu mi300x --link xgmi`: the gang in one Infinity Fabric mesh, as `--link nvlink`
    (the part's own scale-up domain) prices it; the answer keeps the name asked for."""
    moe = ("moe", "--model", "deepseek-v3", "--gpu", "mi300x", "--dp", "8", "--phase", "decode", "--batch", "64")
    xgmi, nvlink = cost(capsys, *moe, "--link", "xgmi"), cost(capsys, *moe, "--link", "nvlink")
    assert xgmi["link"].pop("name") == "xgmi" and nvlink["link"].pop("name") == "nvlink" and xgmi == nvlink
    assert xgmi["link"]["nvlink_gb_s"] == 7 * 64.0  # seven 64 GB/s links, one to each peer


@pytest.mark.parametrize("args", [
    ["moe", "--model", "deepseek-v3", "--gpu", "h100-sxm", "--dp", "8", "--phase", "decode", "--batch", "8",
     "--link", "xgmi"],
    ["prefill", "--model", "gpt-9", "--gpu", "h100-sxm", "--tp", "1", "--tokens", "8"],
    # refused, not guessed: a form factor, a memory size or a release the catalogue does not list
    ["prefill", "--model", "llama-3.1-8b", "--gpu", "H100 PCIe", "--tp", "1", "--tokens", "8"],
    ["prefill", "--model", "llama-3.1-8b", "--gpu", "A100 40GB", "--tp", "1", "--tokens", "8"],
    ["prefill", "--model", "llama-3.1-8b", "--gpu", "H100 or H200", "--tp", "1", "--tokens", "8"],
    ["prefill", "--model", "meta-llama/Meta-Llama-3-70B", "--gpu", "h100-sxm", "--tp", "1", "--tokens", "8"],
    ["prefill", "--model", "llama-3.1-8b", "--gpu", "h900", "--tp", "1", "--tokens", "8"],
    ["prefill", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", "0", "--tokens", "8"],
    ["collective", "--op", "allreduce", "--bytes", "8", "--gpus", "8", "--link", "nvswitch", "--gbps", "400"],
    ["kv", "--model", "llama-3.1-8b", "--tokens", "0", "--link", "rdma"],
])
def test_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    assert main(["cost", *args, "--format", "json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("error: ") and len(captured.err.splitlines()) == 1


def test_the_command_line_contract() -> None:
    done = subprocess.run([sys.executable, "-m", "pools", "cost", "decode", "--model", "qwen3-8b", "--gpu", "h100-sxm",
                           "--tp", "1", "--batch", "1", "--context", "512", "--format", "json"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["model"] == "qwen3-8b" and answer["ms"] > 0
