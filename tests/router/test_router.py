"""The router on loopback in front of simulated engines, driven by the official openai client."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from router.config import DEV_ADMIN_KEY, DEV_KEY, sha256
from tests.support.clients import openai_client
from tests.support.engines import EngineProcess, fault, running_router, start_engine, stop_engine, wait_until_idle
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration
MODEL = "llama-3.1-8b"
LONG = "the prompt that needs a prefill replica " * 200


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    common = ("--model", MODEL, "--gpu", "h100-sxm", "--time-scale", "0.02", "--topology",
              "configs/clusters/local-sim.yaml")
    specs = {"m1": ("mixed", '{"node": "h100-0", "gpus": [0]}'), "m2": ("mixed", '{"node": "h100-1", "gpus": [0]}'),
             "p1": ("prefill", '{"node": "h100-0", "gpus": [1]}'), "d1": ("decode", '{"node": "h100-0", "gpus": [2]}'),
             "d2": ("decode", '{"node": "h100-1", "gpus": [1]}')}
    engines: dict[str, EngineProcess] = {}
    try:
        for name, (role, placement) in specs.items():
            engines[name] = start_engine(*common, "--role", role, "--placement", placement, "--engine-id", name)
        config = {
            "port": 0, "require_keys": True, "topology": "configs/clusters/local-sim.yaml",
            "keys": [{"tenant": "dev", "key_sha256": sha256(DEV_KEY)},
                     {"tenant": "batchy", "key_sha256": sha256("batch-only"), "slo_classes": ["batch"]}],
            "admin_keys": [{"tenant": "ops", "key_sha256": sha256(DEV_ADMIN_KEY)}],
            "slo_classes": [
                {"name": "interactive", "priority": 0, "ttft_ms": 500, "tpot_ms": 50},
                {"name": "standard", "priority": 1, "ttft_ms": 2000, "tpot_ms": 100},
                {"name": "batch", "priority": 2, "ttft_ms": 30000, "tpot_ms": 500, "sheddable": True,
                 "max_concurrency": 1}],
            "default_slo_class": "standard",
            "profiles": {
                "interactive": {"scorers": {"link-tier-scorer": 1.0, "link-health-scorer": 1.0,
                                            "queue-depth-scorer": 1.0}},
                "standard": {"scorers": {"prefix-affinity-scorer": 2.0, "kv-usage-scorer": 0.1}},
                "batch": {"picker": "round-robin-picker"},
            },
            "pd": {"enabled": True, "min_prompt_tokens": 1000},
            "upstream": {"retries": 2, "breaker_failures": 2, "breaker_open_s": 30},
            "scrape_interval_s": 0.2,
            "replicas": [
                {"replica_id": name, "url": engines[name].base, "model": MODEL, "pool": f"pool-{role}", "role": role,
                 "node": json.loads(p)["node"], "gpus": json.loads(p)["gpus"], "tier": "local",
                 "gpu_model": "h100-sxm", "catalog_model": MODEL}
                for name, (role, p) in specs.items()],
        }
        with running_router(config, tmp_path_factory.mktemp("router")) as (proc, url):
            yield {"url": url, "base": url.removesuffix("/v1"), "engines": engines, "proc": proc}
    finally:
        for e in engines.values():
            stop_engine(e)


def pair_idle(cluster: dict[str, Any]) -> None:
    """The PD pair idle in the router's view (`wait_until_idle`): a long prompt then splits."""
    wait_until_idle(cluster["base"], DEV_ADMIN_KEY, ("p1", "d1", "d2"))


def client(cluster: dict[str, Any], key: str = DEV_KEY) -> openai.OpenAI:
    return openai_client(cluster["url"], key, timeout=30)


def get(url: str, key: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_openai_client_through_the_router(cluster: dict[str, Any]) -> None:
    c = client(cluster)
    raw = c.chat.completions.with_raw_response.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                      max_tokens=5)
    chat = raw.parse()
    assert chat.usage is not None and chat.usage.completion_tokens == 5
    assert raw.headers["x-isle-replica"] in ("m1", "m2") and raw.headers["x-isle-tier"] == "local"
    stream = c.completions.create(model=MODEL, prompt="stream me", max_tokens=4, stream=True,
                                  stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    assert [m.id for m in c.models.list()] == [MODEL]
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="gpt-9", prompt="x")
    several = c.completions.with_raw_response.create(model=MODEL, prompt=["x", LONG], n=2, max_tokens=2,
                                                     extra_headers={"x-slo-class": "interactive"})
    assert len(several.parse().choices) == 4  # vLLM serves n > 1 and prompt lists: a choice per prompt and n
    assert several.headers["x-isle-replica"] in ("m1", "m2") and "x-isle-prefill-replica" not in several.headers


def test_profiles_per_class_use_their_plugins(cluster: dict[str, Any]) -> None:
    c = client(cluster)

    def served(prompt: str, cls: str, key: str = DEV_KEY) -> str:
        raw = client(cluster, key).completions.with_raw_response.create(
            model=MODEL, prompt=prompt, max_tokens=1, extra_headers={"x-slo-class": cls})
        return str(raw.headers["x-isle-replica"])

    system = "You are a helpful assistant that answers questions about GPU interconnects. " * 4
    sticky = {served(system + f"question {i}", "standard") for i in range(6)}
    assert len(sticky) == 1  # prefix affinity: one shared prefix, one replica
    spread = {served(f"{i} different prompt", "standard") for i in range(12)}
    assert spread == {"m1", "m2"}
    turns = [served("rr", "batch", "batch-only") for _ in range(4)]
    assert turns in (["m1", "m2", "m1", "m2"], ["m2", "m1", "m2", "m1"])  # round robin
    assert c.models.list().data


def test_keys_classes_and_admin(cluster: dict[str, Any]) -> None:
    with pytest.raises(openai.AuthenticationError):
        client(cluster, key="wrong").completions.create(model=MODEL, prompt="x", max_tokens=1)
    batchy = client(cluster, key="batch-only")
    with pytest.raises(openai.PermissionDeniedError, match="not entitled"):
        batchy.completions.create(model=MODEL, prompt="x", max_tokens=1, extra_headers={"x-slo-class": "interactive"})
    assert batchy.completions.create(model=MODEL, prompt="x", max_tokens=1).choices
    assert get(f"{cluster['base']}/admin/replicas")[0] == 401
    assert get(f"{cluster['base']}/admin/replicas", DEV_KEY)[0] == 403
    status, body = get(f"{cluster['base']}/admin/replicas", DEV_ADMIN_KEY)
    assert status == 200 and {r["replica_id"] for r in json.loads(body)["replicas"]} == {"m1", "m2", "p1", "d1", "d2"}
    status, body = get(f"{cluster['base']}/admin/topology", DEV_ADMIN_KEY)
    assert status == 200 and "fingerprint" in json.loads(body)


def test_long_prompts_go_prefill_then_decode(cluster: dict[str, Any]) -> None:
    c = client(cluster)
    pair_idle(cluster)
    raw = c.completions.with_raw_response.create(model=MODEL, prompt=LONG, max_tokens=6,
                                                 extra_headers={"x-slo-class": "interactive"})
    assert raw.headers["x-isle-prefill-replica"] == "p1" and raw.headers["x-isle-replica"] == "d1"
    assert raw.headers["x-isle-tier"] == "nvlink"  # h100-0 GPU1 -> GPU2: one island
    assert raw.parse().usage.completion_tokens == 6  # type: ignore[union-attr]
    short = c.completions.with_raw_response.create(model=MODEL, prompt="short", max_tokens=2)
    assert "x-isle-prefill-replica" not in short.headers


def _decode_streams(cluster: dict[str, Any]) -> float:
    text = get(f"{cluster['base']}/metrics")[1].decode()
    line = next((ln for ln in text.splitlines() if ln.startswith(
        'isle_router_ttft_seconds_count{pool="pool-decode",slo_class="interactive"')), " 0")
    return float(line.rsplit(" ", 1)[1])


@pytest.mark.parametrize("shape", ["string", "text parts"])
def test_a_long_chat_prompt_goes_pd_whether_string_or_parts(cluster: dict[str, Any], shape: str) -> None:
    """What `vllm bench serve --backend openai-chat` sends (content parts) routes as the same
    prompt as a string: over the PD threshold, prefill then decode. (An image part is refused by
    the text-only model, as vLLM refuses it: tests/router/test_sdk_shapes.py.)"""
    content: Any = LONG
    if shape == "text parts":
        content = [{"type": "text", "text": LONG[: len(LONG) // 2]}, {"type": "text", "text": LONG[len(LONG) // 2:]}]
    pair_idle(cluster)
    before = _decode_streams(cluster)
    stream = client(cluster).chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=3, stream=True,
        extra_headers={"x-slo-class": "interactive"})
    assert stream.headers["x-isle-prefill-replica"] == "p1" and stream.headers["x-isle-replica"] == "d1"
    assert len([c for c in stream.parse() if c.choices]) >= 1
    assert _decode_streams(cluster) == before + 1  # the router's per-pool metrics: the decode pool served it


@pytest.mark.parametrize("shape", ["string", "list of one string", "token ids"])
def test_a_long_completion_prompt_goes_pd_in_every_shape(cluster: dict[str, Any], shape: str) -> None:
    """`prompt` as vLLM accepts it (a string, a list of strings, token ids): one reading, one route."""
    prompt: Any = {"string": LONG, "list of one string": [LONG], "token ids": [17] * 1500}[shape]
    pair_idle(cluster)
    before = _decode_streams(cluster)
    stream = client(cluster).completions.with_raw_response.create(
        model=MODEL, prompt=prompt, max_tokens=3, stream=True, extra_headers={"x-slo-class": "interactive"})
    assert stream.headers["x-isle-prefill-replica"] == "p1" and stream.headers["x-isle-replica"] == "d1"
    assert len([c for c in stream.parse() if c.choices]) >= 1
    assert _decode_streams(cluster) == before + 1


def _sum(cluster: dict[str, Any], prefix: str) -> float:
    """The sum of every series of the router's /metrics that starts with `prefix`."""
    text = get(f"{cluster['base']}/metrics")[1].decode()
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(prefix))


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_itl_is_counted_per_token_gap(cluster: dict[str, Any], kind: str) -> None:
    """A 64-token stream has 63 gaps between its tokens (as vLLM's engine counts them), whatever
    the role, finish, usage and [DONE] chunks around them."""
    before = _sum(cluster, 'isle_router_itl_seconds_count{pool="pool-mixed"}')
    c = client(cluster)
    options: Any = {"include_usage": True}
    chunks: list[Any]
    if kind == "chat":
        chunks = list(c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=64, stream=True, stream_options=options))
    else:
        chunks = list(c.completions.create(model=MODEL, prompt="hi", max_tokens=64, stream=True,
                                           stream_options=options))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 64
    assert _sum(cluster, 'isle_router_itl_seconds_count{pool="pool-mixed"}') == before + 63


def test_a_non_streamed_request_has_ttft_tpot_and_counts_once_as_ok(cluster: dict[str, Any]) -> None:
    """Non-streamed, over PD: TTFT and TPOT recorded (from the engine's own timing), and one
    `ok`, never `cancelled`, though the client hangs up the moment its answer is in."""
    ttft = 'isle_router_ttft_seconds_count{pool="pool-decode",slo_class="interactive"'
    tpot = 'isle_router_tpot_seconds_count{slo_class="interactive"}'
    ok, cancelled = ('isle_router_requests_total{outcome="ok",slo_class="interactive"}',
                     'isle_router_requests_total{outcome="cancelled",slo_class="interactive"}')
    before = [_sum(cluster, k) for k in (ttft, tpot, ok, cancelled)]
    for _ in range(3):
        pair_idle(cluster)
        with client(cluster) as c:
            raw = c.completions.with_raw_response.create(model=MODEL, prompt=LONG, max_tokens=4,
                                                         extra_headers={"x-slo-class": "interactive"})
            usage = raw.parse().usage
            assert raw.headers["x-isle-prefill-replica"] == "p1" and usage is not None and usage.completion_tokens == 4
    time.sleep(0.3)
    after = [_sum(cluster, k) for k in (ttft, tpot, ok, cancelled)]
    assert [a - b for a, b in zip(after, before, strict=True)] == [3, 3, 3, 0]


def test_a_served_model_is_retrieved_and_an_unknown_one_is_404(cluster: dict[str, Any]) -> None:
    c = client(cluster)
    model = c.models.retrieve(MODEL)
    assert (model.id, model.object) == (MODEL, "model")
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("gpt-9")


def _post(cluster: dict[str, Any], path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
    req = urllib.request.Request(f"{cluster['base']}{path}", data=json.dumps(body).encode(), method="POST",
                                 headers={"authorization": f"Bearer {DEV_KEY}", "content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), json.loads(err.read())


def test_tokenize_and_detokenize_are_answered_by_a_replica_of_the_model(cluster: dict[str, Any]) -> None:
    """What `vllm bench serve` asks: /tokenize counts as the engine charges (usage.prompt_tokens),
    /detokenize gives the text back; both proxied to a replica serving the body's model."""
    status, headers, tokens = _post(cluster, "/tokenize", {"model": MODEL, "prompt": "an island of GPUs"})
    assert status == 200 and headers["x-isle-replica"] in ("m1", "m2", "p1", "d1", "d2")
    usage = client(cluster).completions.create(model=MODEL, prompt="an island of GPUs", max_tokens=1).usage
    assert usage is not None and tokens["count"] == usage.prompt_tokens == len(tokens["tokens"])
    status, _, text = _post(cluster, "/detokenize", {"model": MODEL, "tokens": tokens["tokens"]})
    assert status == 200 and text["prompt"] == "an island of GPUs"
    status, _, error = _post(cluster, "/tokenize", {"model": "gpt-9", "prompt": "x"})
    assert status == 404 and error["error"]["param"] == "model"


def test_refusals_are_counted_once_with_their_cause(cluster: dict[str, Any]) -> None:
    unknown = 'isle_router_rejections_total{cause="unknown_model",slo_class="standard"}'
    bad = 'isle_router_rejections_total{cause="bad_request",slo_class="standard"}'
    rejected = 'isle_router_requests_total{outcome="rejected",slo_class="standard"}'
    before = [_sum(cluster, k) for k in (unknown, bad, rejected)]
    c = client(cluster)
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="gpt-9", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model=MODEL, prompt=[], max_tokens=2)
    after = [_sum(cluster, k) for k in (unknown, bad, rejected)]
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 1, 2]


def test_metrics_carry_class_pool_and_tier(cluster: dict[str, Any]) -> None:
    c = client(cluster)
    list(c.completions.create(model=MODEL, prompt=LONG, max_tokens=3, stream=True,
                              extra_headers={"x-slo-class": "interactive"}))
    list(c.completions.create(model=MODEL, prompt="x", max_tokens=3, stream=True))
    status, text = get(f"{cluster['base']}/metrics")
    body = text.decode()
    assert status == 200
    assert re.search(r'isle_router_ttft_seconds_bucket\{le="[0-9.e+-]+",pool="pool-decode",slo_class="interactive",'
                     r'tier="nvlink"\}', body)
    assert 'slo_class="standard",tier="local"' in body
    assert 'isle_router_requests_total{outcome="ok",slo_class="interactive"}' in body


def test_batch_is_shed_with_retry_after(cluster: dict[str, Any]) -> None:
    async def main() -> list[int]:
        async def one() -> int:
            c = openai.AsyncOpenAI(base_url=cluster["url"], api_key="batch-only", max_retries=0, timeout=30)
            try:
                await c.completions.create(model=MODEL, prompt="x", max_tokens=40)
                return 200
            except openai.RateLimitError as err:
                assert err.response.headers["retry-after"] == "1"
                return 429
            finally:
                await c.close()

        return await asyncio.gather(*(one() for _ in range(6)))

    codes = asyncio.run(main())
    assert 200 in codes and 429 in codes


def test_retries_and_circuit_breaker(cluster: dict[str, Any]) -> None:
    m1 = cluster["engines"]["m1"]
    req = urllib.request.Request(f"{m1.base}/admin/faults", data=b'{"fail_requests": 503}',
                                 headers={"content-type": "application/json"})
    urllib.request.urlopen(req, timeout=5).read()
    c = client(cluster)

    def m1_open() -> bool:
        _status, body = get(f"{cluster['base']}/admin/replicas", DEV_ADMIN_KEY)
        return bool({r["replica_id"]: r for r in json.loads(body)["replicas"]}["m1"]["breaker_open"])

    served = set()
    for i in range(40):  # how often m1 is tried first depends on the scores (load, a loaded machine)
        served.add(c.completions.with_raw_response.create(model=MODEL, prompt=f"r{i}", max_tokens=1).headers[
            "x-isle-replica"])
        if i >= 7 and m1_open():
            break
    assert served == {"m2"}  # m1 fails before the first byte: every request retried on m2, none lost
    assert m1_open()  # its second failure opened its breaker


def running(engine: EngineProcess) -> float:
    text = urllib.request.urlopen(f"{engine.base}/metrics", timeout=5).read().decode()
    line = next(ln for ln in text.splitlines() if ln.startswith("vllm:num_requests_running"))
    return float(line.rsplit(" ", 1)[1])


def test_client_disconnect_cancels_the_upstream_request(cluster: dict[str, Any]) -> None:
    import socket

    engines = cluster["engines"]
    for name in ("m1", "m2"):
        fault(engines[name], {"clear": True})
        fault(engines[name], {"slowdown": 100})
    host, port = cluster["base"].removeprefix("http://").split(":")
    body = json.dumps({"model": MODEL, "prompt": "long", "max_tokens": 2000, "stream": True}).encode()
    with socket.create_connection((host, int(port)), 5) as sock:
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {DEV_KEY}\r\n"
                     f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body)
        got = b""
        while b"data: {" not in got:  # headers first, then the first token
            got += sock.recv(65536)
        assert running(engines["m1"]) + running(engines["m2"]) == 1
    wait_until(lambda: running(engines["m1"]) + running(engines["m2"]) == 0, 3,
               "the engine stopped generating")
    for name in ("m1", "m2"):
        fault(engines[name], {"clear": True})


def test_pd_falls_back_to_the_next_decode_and_the_tier_says_cross_node(cluster: dict[str, Any]) -> None:
    engines = cluster["engines"]
    pair_idle(cluster)
    first = client(cluster).completions.with_raw_response.create(
        model=MODEL, prompt=LONG + "first", max_tokens=3, extra_headers={"x-slo-class": "interactive"})
    assert first.headers["x-isle-replica"] == "d1" and first.headers["x-isle-tier"] == "nvlink"  # same island
    fault(engines["d1"], {"fail_requests": 503})  # the same-island decode is failing
    try:
        pair_idle(cluster)
        raw = client(cluster).completions.with_raw_response.create(
            model=MODEL, prompt=LONG + "again", max_tokens=3, extra_headers={"x-slo-class": "interactive"})
        assert raw.headers["x-isle-prefill-replica"] == "p1" and raw.headers["x-isle-replica"] == "d2"
        assert raw.headers["x-isle-tier"] == "rdma"  # the KV crossed nodes: not the same-island tier
        text = get(f"{cluster['base']}/metrics")[1].decode()
        assert 'isle_router_kv_transfer_seconds_count{pool="pool-decode",slo_class="interactive",tier="rdma"}' in text
        assert 'isle_router_kv_transfer_seconds_count{pool="pool-decode",slo_class="interactive",tier="nvlink"}' in text
    finally:
        fault(engines["d1"], {"clear": True})


def test_interactive_holds_while_batch_is_shed_and_pd_falls_back_to_mixed(cluster: dict[str, Any]) -> None:
    async def main() -> tuple[list[int], list[int]]:
        async def one(key: str, cls: str) -> int:
            c = openai.AsyncOpenAI(base_url=cluster["url"], api_key=key, max_retries=0, timeout=30)
            try:
                await c.completions.create(model=MODEL, prompt="x", max_tokens=30, extra_headers={"x-slo-class": cls})
                return 200
            except openai.RateLimitError:
                return 429
            finally:
                await c.close()

        inter = [one(DEV_KEY, "interactive") for _ in range(6)]
        batch = [one("batch-only", "batch") for _ in range(6)]
        results = await asyncio.gather(*inter, *batch)
        return list(results[:6]), list(results[6:])

    interactive, batch = asyncio.run(main())
    assert interactive == [200] * 6 and 429 in batch  # batch is shed first; interactive is served

    fault(cluster["engines"]["p1"], {"fail_requests": 503})
    try:
        raw = client(cluster).completions.with_raw_response.create(
            model=MODEL, prompt=LONG + "fallback", max_tokens=2, extra_headers={"x-slo-class": "interactive"})
        assert "x-isle-prefill-replica" not in raw.headers and raw.headers["x-isle-replica"] in ("m1", "m2")
    finally:
        fault(cluster["engines"]["p1"], {"clear": True})


def test_clients_cannot_steer_kv_transfer_and_the_path_is_kept(cluster: dict[str, Any]) -> None:
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2,
            "kv_transfer_params": {"do_remote_prefill": True, "remote_engine_id": "m1", "remote_host": "127.0.0.1",
                                   "remote_port": 1, "remote_request_id": "cmpl-m1-0"}}
    for _ in range(3):
        req = urllib.request.Request(f"{cluster['url']}/completions", data=json.dumps(body).encode(),
                                     headers={"authorization": f"Bearer {DEV_KEY}", "content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200 and "kv_transfer_params" not in json.loads(resp.read())
    _status, replicas = get(f"{cluster['base']}/admin/replicas", DEV_ADMIN_KEY)
    before = {r["replica_id"]: r["breaker_open"] for r in json.loads(replicas)["replicas"]}
    assert not before["m2"]  # the bogus params never reached an engine: m2 (serving while m1's breaker is open) is fine
    with pytest.raises(openai.BadRequestError):  # a completion body on the chat route: the engine says no
        client(cluster).post("/chat/completions", cast_to=object, body={"model": MODEL, "prompt": "x"})


def test_client_leaving_before_the_first_byte_frees_everything(cluster: dict[str, Any]) -> None:
    import socket

    engines = cluster["engines"]
    for name in ("m1", "m2"):
        fault(engines[name], {"clear": True})
        fault(engines[name], {"slowdown": 100})
    host, port = cluster["base"].removeprefix("http://").split(":")
    body = json.dumps({"model": MODEL, "prompt": "slow", "max_tokens": 500}).encode()  # non-stream
    with socket.create_connection((host, int(port)), 5) as sock:
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {DEV_KEY}\r\n"
                     f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body)
        time.sleep(0.5)

    def idle() -> bool:
        _status, data = get(f"{cluster['base']}/admin/replicas", DEV_ADMIN_KEY)
        inflight = sum(r["inflight"] for r in json.loads(data)["replicas"])
        return inflight == 0 and running(engines["m1"]) + running(engines["m2"]) == 0

    wait_until(idle, 5, "nothing in flight at the router, nothing running on the engines", interval_s=0.1)
    for name in ("m1", "m2"):
        fault(engines[name], {"clear": True})


def test_failed_decode_releases_the_prefills_kv(cluster: dict[str, Any]) -> None:
    engines = cluster["engines"]
    for name in ("d1", "d2"):
        fault(engines[name], {"fail_requests": 503})
    try:
        raw = client(cluster).completions.with_raw_response.create(
            model=MODEL, prompt=LONG + "release", max_tokens=2, extra_headers={"x-slo-class": "interactive"})
        assert raw.headers["x-isle-replica"] in ("m1", "m2")  # served by a mixed replica instead
        with urllib.request.urlopen(f"{engines['p1'].base}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        usage = next(ln for ln in text.splitlines() if ln.startswith("vllm:kv_cache_usage_perc"))
        assert float(usage.rsplit(" ", 1)[1]) == 0.0  # nothing held for a decode that will never come
    finally:
        for name in ("d1", "d2"):
            fault(engines[name], {"clear": True})


def test_no_retry_after_the_first_byte(cluster: dict[str, Any]) -> None:
    engines = cluster["engines"]
    for name in ("m1", "m2"):
        fault(engines[name], {"clear": True})
        fault(engines[name], {"crash_after_tokens": 3})
    got: list[str] = []
    with pytest.raises((openai.APIError, openai.APIConnectionError)):
        for ch in client(cluster).completions.create(model=MODEL, prompt="crash", max_tokens=50, stream=True):
            got.extend(c.text for c in ch.choices)
    assert 0 < len(got) < 50 and len(got) == len(set(zip(range(len(got)), got, strict=True)))
    wait_until(lambda: any(engines[n].proc.poll() is not None for n in ("m1", "m2")), 10, "a replica exited")
    # the replica died mid-stream; the client got an error, not a second copy of the tokens
    assert any(engines[n].proc.poll() == 17 for n in ("m1", "m2"))
