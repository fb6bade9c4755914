"""Prometheus-native operations, on a real router (`python -m router --config`) in front of four
simulated engines placed as configs/local.yaml places them (router.bench.scrape): the service
discovery endpoint, the router's latency clocks from the request's first byte, PD decisions
timed, traffic per replica; and a real Prometheus (Debian's `prometheus`) that finds every
engine through the endpoint with the shipped configs/prometheus.yml, scrapes them, and answers
every query of the shipped Grafana dashboard with data, labelled as its legends say."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from router import targets
from router.bench.scrape import ENGINES, LONG, Deployment, drive, local_deployment
from router.config import DEV_ADMIN_KEY, DEV_KEY
from tests.conftest import ROOT
from tests.support.wait import wait_until

pytestmark = pytest.mark.integration
PROMETHEUS = shutil.which("prometheus")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with local_deployment(tmp_path_factory.mktemp("local"), time_scale=0.02) as d:
        yield d


def get(url: str, key: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def series(d: Deployment, prefix: str) -> float:
    """The sum of the router's /metrics series that start with `prefix`."""
    text = get(f"{d.base}/metrics", DEV_ADMIN_KEY)[1].decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def chat(d: Deployment, prompt: str, cls: str = "standard") -> int:
    body = json.dumps({"model": "llama-3.1-8b", "messages": [{"role": "user", "content": prompt}],
                       "max_tokens": 4}).encode()
    request = urllib.request.Request(f"{d.base}/v1/chat/completions", data=body, headers={
        "authorization": f"Bearer {DEV_KEY}", "content-type": "application/json", "x-slo-class": cls})
    with urllib.request.urlopen(request, timeout=60) as resp:
        resp.read()
        return int(resp.status)


def test_service_discovery_lists_the_router_and_every_engine_with_its_placement(deployment: Deployment) -> None:
    url = deployment.base + targets.PATH
    assert get(url)[0] == 401
    assert get(url, DEV_KEY)[0] == 403  # a user key does not list the engines' addresses
    status, body = get(url, DEV_ADMIN_KEY)
    assert status == 200
    groups = json.loads(body)
    router = [g for g in groups if g["labels"]["component"] == "router"]
    assert [g["targets"] for g in router] == [[deployment.base.removeprefix("http://")]]
    engines = {g["labels"]["replica"]: g for g in groups if g["labels"]["component"] == "engine"}
    assert set(engines) == set(deployment.engines)
    for rid, role, node, _gpus, island, tier, _gpu in ENGINES:
        group = engines[rid]
        assert group["targets"] == [deployment.engines[rid].removeprefix("http://")]
        assert group["labels"] == {"component": "engine", "replica": rid, "pool": role, "role": role,
                                   "model": "llama-3.1-8b", "node": node, "island": island, "tier": tier}
        assert get(f"{deployment.engines[rid]}/metrics")[0] == 200  # open, as vLLM's are


def test_latency_counts_from_the_first_byte_of_the_request(deployment: Deployment) -> None:
    """A client that takes its time sending the body: the router's E2E and TTFT include it (the
    client waited for it too), not only what came after the router had the whole request."""
    pause_s = 0.5
    e2e = 'isle_router_e2e_seconds_sum{slo_class="standard"}'
    ttft = 'isle_router_ttft_seconds_sum{pool="mixed",slo_class="standard"'
    before = series(deployment, e2e), series(deployment, ttft)
    body = json.dumps({"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 2}).encode()
    host, port = deployment.base.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"x-slo-class: standard\r\nauthorization: Bearer " + DEV_KEY.encode()
                     + b"\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n")
        time.sleep(pause_s)  # the client's slow upload
        sock.sendall(body)
        with sock.makefile("rb") as answer_file:
            answer = answer_file.readline()  # the status line: the answer has come
    assert answer.startswith(b"HTTP/1.1 200"), answer
    # the router stamps the first byte when its loop reads it, which on a loaded machine can be a
    # few milliseconds after it arrived: the pause is counted, less that
    assert series(deployment, e2e) - before[0] >= pause_s - 0.05
    assert series(deployment, ttft) - before[1] >= pause_s - 0.05


def test_every_pd_decision_is_timed_and_traffic_is_counted_per_replica(deployment: Deployment) -> None:
    pd = 'isle_router_decision_seconds_count{kind="pd"}'
    sent = {rid: f'isle_router_replica_requests_total{{replica="{rid}"}}' for rid in deployment.engines}
    before = series(deployment, pd), {rid: series(deployment, s) for rid, s in sent.items()}
    for k in range(6):
        assert chat(deployment, f"{k} {LONG}", "interactive") == 200  # interactive: PD pools only
    assert series(deployment, pd) - before[0] == 6
    after = {rid: series(deployment, s) - before[1][rid] for rid, s in sent.items()}
    assert after["prefill-0"] == after["decode-0"] == 6, after


# a real Prometheus

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prometheus_config(d: Deployment, key_file: Path) -> dict[str, Any]:
    """configs/prometheus.yml pointed at this router (its address and the admin key's file),
    scraping every second so that a short test sees rates."""
    config: dict[str, Any] = yaml.safe_load((ROOT / "configs/prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    for job in config["scrape_configs"]:
        job["scrape_interval"] = "1s"
        if "authorization" in job:
            job["authorization"] = {**job["authorization"], "credentials_file": str(key_file)}
        for sd in job["http_sd_configs"]:
            assert urllib.parse.urlsplit(sd["url"]).path == targets.PATH
            sd["url"] = d.base + targets.PATH
            sd["refresh_interval"] = "1s"
            sd["authorization"] = {**sd["authorization"], "credentials_file": str(key_file)}
    return config


def query(api: str, expr: str) -> list[dict[str, Any]]:
    status, body = get(f"{api}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    assert status == 200, body[:300]
    return list(json.loads(body)["data"]["result"])


def answered(rows: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The rows with a number (a quantile of no traffic is NaN), or None when none has one."""
    found = [r for r in rows if r["value"][1] not in ("NaN", "+Inf", "-Inf")]
    return found or None


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(panel, expr, legend) of every target of the shipped dashboard, Grafana's rate interval
    as a window that holds the whole test (a rate over it is not 0 however slow the machine)."""
    dash = json.loads((ROOT / "configs/grafana-isleserve.json").read_text())
    return [(p["title"], t["expr"].replace("$__rate_interval", "5m"), t.get("legendFormat", ""))
            for p in dash["panels"] for t in p["targets"]]


@pytest.fixture(scope="module")
def prometheus(deployment: Deployment, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if PROMETHEUS is None:
        pytest.skip("the `prometheus` binary is not installed (Debian: apt-get install -y --no-install-recommends "
                    "prometheus)")
    work = tmp_path_factory.mktemp("prometheus")
    key_file = work / "admin-key"
    key_file.write_text(DEV_ADMIN_KEY)
    (work / "prometheus.yml").write_text(yaml.safe_dump(prometheus_config(deployment, key_file)))
    port = free_port()
    log = (work / "prometheus.log").open("wb")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={work / 'prometheus.yml'}",
                             f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT, cwd=work)
    api = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: get(f"{api}/-/ready")[0] == 200, 60, "prometheus ready",
                   ignore=(urllib.error.URLError, ConnectionError))
        yield api
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_prometheus_finds_every_engine_and_answers_every_dashboard_query(deployment: Deployment,
                                                                         prometheus: str) -> None:
    def up() -> list[dict[str, Any]] | None:
        found = query(prometheus, "up == 1")
        return found if len(found) == 1 + len(deployment.engines) else None

    targets_up = wait_until(up, 60, "the router and every engine scraped",
                            seen=lambda: query(prometheus, "up"))
    engines = {t["metric"]["replica"]: t["metric"] for t in targets_up if t["metric"]["job"] == "isle-engines"}
    assert set(engines) == set(deployment.engines)
    for rid, role, node, _gpus, island, _tier, _gpu in ENGINES:
        assert (engines[rid]["pool"], engines[rid]["role"], engines[rid]["node"], engines[rid]["island"]) == (
            role, role, node, island)
    assert [t["metric"]["job"] for t in targets_up if t["metric"].get("component") == "router"] == ["isle-router"]

    statuses = drive(deployment.base, 160, concurrency=4)
    assert set(statuses) == {200}, statuses

    def answer(expr: str) -> list[dict[str, Any]] | None:
        """The query's rows with numbers; none yet: more load. A series Prometheus first sees with
        its final count has no rate (it was born after the load), so the load goes on, a little
        at a time, until the scrapes have seen it grow."""
        found = answered(query(prometheus, expr))
        if found is None:
            drive(deployment.base, 8, concurrency=4)
        return found

    for panel, expr, legend in dashboard_queries():
        result = wait_until(lambda e=expr: answer(e), 90, f"{panel!r}: {expr}", interval_s=0.5)  # type: ignore[misc]
        shown = re.findall(r"\{\{(\w+)\}\}", legend)
        for row in result:
            assert all(row["metric"].get(label) for label in shown), (panel, legend, row["metric"])
            assert row["metric"].get("instance") is None or "instance" in shown
    def receiving() -> set[str] | None:  # every engine receives traffic: PD legs and whole requests
        rows = answer("sum by (replica) (rate(isle_router_replica_requests_total[5m])) > 0") or []
        found = {row["metric"]["replica"] for row in rows}
        return found if found == set(deployment.engines) else None

    wait_until(receiving, 90, "traffic to every engine", interval_s=0.5)
