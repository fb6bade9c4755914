"""Garbage in, one clear error out: hypothesis on what the product reads from users — router
config, pools files, the Ray Serve app's args, cluster specs and topology files (bytes, not only
text), load-test traces. Each either loads or raises the one error type its CLI prints as one
line (ParseError / WorkloadError); never another exception. (Text captures of nvidia-smi and NCCL
XML are fuzzed in tests/topology/test_capture_parse_properties.py; trace round trips in
tests/loadtest/test_workloads.py.)"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from isleserve.settings import parse_app_args
from loadtest.workload import load_workload
from loadtest.workloads import WorkloadError
from pools.config import load_pools
from router.config import RouterConfig, load_router_config, parse_router_config
from topology.errors import ParseError
from topology.readers import read_source

pytestmark = pytest.mark.unit

FAST = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
WORDS = ["h100-sxm", "hgx-h100", "dgx-a100", "llama-3.1-8b", "interactive", "standard", "batch", "mixed",
         "prefill", "decode", "*", "nvml", "sim", "vllm", "island-aligned", "auto", "node-0", "127.0.0.1",
         "http://127.0.0.1:8001", "configs/clusters/local-sim.yaml", "nvlink", "ib", "0", "tenant"]
FIELDS = sorted({*RouterConfig.model_fields, "tenant", "key_sha256", "key_hmac_sha256", "key_env", "key_file",
                 "slo_classes", "name",
                 "priority", "ttft_ms", "tpot_ms", "sheddable", "max_concurrency", "pools", "role", "tp",
                 "replicas", "model", "topology", "engine", "policy", "router", "time_scale", "nodes", "racks",
                 "template", "count", "gpu", "capture", "fabric", "health", "degraded_links", "gpus",
                 "lanes_active", "url", "replica_id", "filters", "scorers", "picker", "enabled"})
scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 9), st.sampled_from([2**63, -(10**20), 10**20]),
                    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(WORDS), st.text(max_size=8))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3),
    st.dictionaries(st.one_of(st.sampled_from(FIELDS), st.text(max_size=4)), inner, max_size=5)), max_leaves=20)
documents = st.dictionaries(st.sampled_from(FIELDS), values, max_size=6) | values


def _file(content: bytes, name: str) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="isle-fuzz-"))
    path = folder / name
    path.write_bytes(content)
    return path


def _dump(doc: Any) -> bytes:
    try:
        return yaml.safe_dump(doc).encode()
    except (yaml.YAMLError, ValueError):
        return b"{"


garbage = st.one_of(st.binary(max_size=200), documents.map(_dump), st.text(max_size=200).map(str.encode))


@FAST
@given(documents)
def test_router_config_loads_or_says_what_is_wrong(doc: Any) -> None:
    try:
        parse_router_config(doc)
    except ParseError as err:
        assert str(err).strip()


@FAST
@given(garbage)
def test_router_config_files_load_or_say_what_is_wrong(content: bytes) -> None:
    try:
        load_router_config(str(_file(content, "router.yaml")))
    except ParseError as err:
        assert str(err).strip()


@FAST
@given(garbage)
def test_pools_files_load_or_say_what_is_wrong(content: bytes) -> None:
    try:
        load_pools(str(_file(content, "pools.yaml")))
    except ParseError as err:
        assert str(err).strip()


@FAST
@given(documents)
def test_app_args_load_or_say_what_is_wrong(doc: Any) -> None:
    try:
        parse_app_args(doc)
    except ParseError as err:
        assert str(err).strip()


@FAST
@given(st.one_of(garbage, st.dictionaries(st.sampled_from(["name", "nodes", "racks", "fabric", "health"]),
                                          values, min_size=1, max_size=4).map(_dump)),
       st.sampled_from(["spec.yaml", "topo.txt", "topo.xml", "topo.json"]))
def test_topology_files_read_or_say_what_is_wrong(content: bytes, name: str) -> None:
    try:
        read_source(str(_file(content, name)))
    except ParseError as err:
        assert str(err).strip() and "\n" not in str(err).strip()


lines = st.one_of(
    st.fixed_dictionaries({}, optional={"timestamp": values, "input_length": values, "output_length": values,
                                        "hash_ids": values}).map(json.dumps),
    st.lists(st.one_of(st.sampled_from(["2023-11-16 18:15:46.6805900", "5", "-1", "x", ""]), st.text(max_size=6)),
             max_size=4).map(",".join),
    st.text(max_size=30))


@FAST
@given(st.lists(lines, max_size=6), st.sampled_from(["trace.jsonl", "trace.csv", "trace.json"]),
       st.sampled_from(["TIMESTAMP,ContextTokens,GeneratedTokens", ""]))
def test_trace_files_read_or_say_what_is_wrong(rows: list[str], name: str, header: str) -> None:
    content = "\n".join([header, *rows] if name.endswith(".csv") else rows)
    try:
        load_workload(str(_file(content.encode(), name)))
    except WorkloadError as err:
        assert str(err).strip()


@FAST
@given(st.binary(max_size=300), st.sampled_from(["trace.jsonl", "trace.csv", "trace.json", "trace.txt"]))
def test_binary_trace_files_say_what_is_wrong(content: bytes, name: str) -> None:
    try:
        load_workload(str(_file(content, name)))
    except WorkloadError as err:
        assert str(err).strip()
