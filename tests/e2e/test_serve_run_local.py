"""The product as a user starts it (`make run`: `isle run configs/local.yaml`, Ray Serve's `serve
run` inside), on a machine where another program already runs a Ray head (and RAY_ADDRESS names
it): one line saying the endpoint is ready, the request path compiled, then the OpenAI endpoint
on http://127.0.0.1:8000/v1 with the development key, every `sh local` command of the README and
docs run verbatim, metrics, the admin plan, and a clean stop on SIGTERM: exit 0 within 15 s, no
stack trace, no alarming line, no engine left behind, nothing of it in the other Ray."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtest.live.deploy import port_in_use, ray_ports
from router.config import DEV_ADMIN_KEY, DEV_KEY
from tests.conftest import ROOT
from tests.docs.mdblocks import commands
from tests.security.listeners import grpc_statuses, http_answer, listeners, process_tree, ray_services
from tests.support.clients import openai_client
from tests.support.wait import START_S
from topology.draw import VERDICT_COLOURS
from wire import native
from wire.processes import ChildExited, ChildNotReady, Group, Output, ReadyLine, ReadyProbe, Stop, session_pids
from wire.supervisor import Child

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]  # past START_S waits
BASE = "http://127.0.0.1:8000"


def _cmdlines(sid: int) -> dict[int, str]:
    """The command line of every process of this session (one that ends meanwhile is left out)."""
    found = {}
    for pid in session_pids(sid):
        try:
            found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
    return found


def _our_engines(sid: int) -> list[int]:
    """Engine processes of this `serve run` (its session: the local Ray it started and the engines
    of its replica actors), never another run's on the same machine."""
    return [pid for pid, cmdline in _cmdlines(sid).items() if "sim-engine" in cmdline]


def _alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                out.append(pid)
        except OSError:
            continue
    return out


READY = "isleserve: OpenAI API on http://127.0.0.1:8000/v1, 4 replicas ready"
STOP_WITHIN_S = 15.0
FOREIGN_PORTS = ("--port", "--ray-client-server-port", "--node-manager-port", "--object-manager-port",
                 "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--metrics-export-port",
                 "--runtime-env-agent-port")
ALARMING = ("Traceback", "graceful_shutdown failed", "ERROR", "Error:")


def _foreign_processes(sid: int) -> list[str]:
    """Command lines in the other program's Ray that a deployment would have started there."""
    return [c[:120] for c in _cmdlines(sid).values() if "Serve" in c or "sim-engine" in c or "isleserve" in c]


@pytest.fixture(scope="module")
def foreign_ray(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Child, str]]:
    """Another program's Ray head on this machine, without authentication (the worst one to join):
    `ray start --head --block`, in a temporary directory of its own (never the machine's /tmp/ray,
    which other programs may use), with its address exported the way its user would."""
    temp_dir = tmp_path_factory.mktemp("foreign-ray")
    ports = dict(zip(FOREIGN_PORTS, ray_ports(len(FOREIGN_PORTS)), strict=True))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    cmd = [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
           "--temp-dir", str(temp_dir), "--num-cpus", "1", "--include-dashboard", "false", "--disable-usage-stats",
           *(x for option, port in ports.items() for x in (option, str(port)))]
    proc = Child(cmd, name="another program's ray head", ready=ReadyProbe(lambda: port_in_use(ports["--port"])),
                 cwd=ROOT, env=env, group=Group.SESSION, stdout=Output.DEVNULL, stderr=Output.DEVNULL,
                 stop=Stop(grace_s=30.0, linger_s=10.0)).start()
    try:
        proc.wait_ready(START_S, poll_s=0.5)
        yield proc, f"127.0.0.1:{ports['--port']}"
    finally:
        proc.stop()
        assert not session_pids(proc.pid)


@pytest.fixture(scope="module")
def product(tmp_path_factory: pytest.TempPathFactory, foreign_ray: tuple[Child, str]) -> Iterator[Child]:
    foreign, address = foreign_ray
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "RAY_ADDRESS": address}
    isle = Path(sys.executable).parent / "isle"
    out = tmp_path_factory.mktemp("run") / "out.txt"
    # SIGTERM to it alone (a service manager's stop); SIGKILL to its session if it is still there after 90 s
    proc = Child([str(isle), "run", "configs/local.yaml"], name="isle run", ready=ReadyLine(READY), cwd=ROOT, env=env,
                 group=Group.SESSION, stderr=Output.STDOUT, log_path=out, stop=Stop(grace_s=90.0, linger_s=None))
    proc.start()
    try:
        try:
            proc.wait_ready(START_S, stop_on_failure=False)
        except ChildExited as err:
            pytest.fail(f"isle run exited: {err}")
        except ChildNotReady:
            pytest.fail(f"no ready line within {START_S:g} s")
        # the line comes once the endpoint answers
        req = urllib.request.Request(f"{BASE}/v1/models", headers={"authorization": f"Bearer {DEV_KEY}"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.status == 200
        engines = _our_engines(proc.pid)
        assert len(engines) == 4  # prefill, decode and two mixed replicas
        assert not _foreign_processes(foreign.pid), _foreign_processes(foreign.pid)  # nothing in the other Ray
        yield proc
    finally:
        engines = locals().get("engines", [])
        stop_sent = time.monotonic()
        code = proc.stop()  # Ctrl-C is the same path
        took_s = time.monotonic() - stop_sent
        deadline = time.monotonic() + 20
        while _alive(engines) and time.monotonic() < deadline:
            time.sleep(0.5)
        leftover = _alive(engines)
        for pid in leftover:
            os.kill(pid, signal.SIGKILL)
        text = out.read_text(errors="replace")
        assert not leftover, f"engines left behind: {leftover}"
        assert code == 0, (code, text[-3000:])
        assert took_s < STOP_WITHIN_S, (took_s, text[-3000:])
        tail = text[text.index("isleserve: stopping"):] if "isleserve: stopping" in text else text
        assert not [w for w in ALARMING if w in tail], tail[-3000:]  # a clean stop says nothing alarming
        assert "Traceback" not in text
        assert text.count(READY) == 1 and "no Ray node carries it" not in text
        assert f"isleserve: request path: {native.explain()}" in text  # what the tree it runs is built as


LOCAL_COMMANDS = commands("sh local")


def _error_answer(out: str) -> bool:
    """An OpenAI error body (curl exits 0 on an HTTP error)."""
    try:
        doc = json.loads(out)
    except ValueError:
        return False
    return isinstance(doc, dict) and "error" in doc


def test_every_local_command_of_the_docs_runs_verbatim(product: Child) -> None:
    """README.md and docs/ commands that need the running deployment, as written, in order."""
    assert len(LOCAL_COMMANDS) >= 5
    failed = []
    for command in LOCAL_COMMANDS:
        done = subprocess.run(["bash", "-c", command.text], cwd=ROOT, capture_output=True, text=True, timeout=180,
                              check=False)
        if done.returncode != 0 or _error_answer(done.stdout):
            failed.append(f"{command.id}: {command.text}\nexit {done.returncode}\n{done.stdout[-800:]}"
                          f"\n{done.stderr[-800:]}")
    assert not failed, "\n\n".join(failed)


def test_chat_streams_metrics_and_admin(product: Child) -> None:
    c = openai_client(f"{BASE}/v1", DEV_KEY, timeout=30)
    chat = c.chat.completions.create(model="llama-3.1-8b", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert chat.usage is not None and chat.usage.completion_tokens == 4
    chunks = list(c.chat.completions.create(model="llama-3.1-8b", messages=[{"role": "user", "content": "x " * 600}],
                                            max_tokens=3, stream=True, stream_options={"include_usage": True},
                                            extra_headers={"x-slo-class": "interactive"}))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    with urllib.request.urlopen(f"{BASE}/metrics", timeout=5) as resp:
        metrics = resp.read().decode()
    assert 'tier="nvlink"' in metrics and 'slo_class="interactive"' in metrics
    req = urllib.request.Request(f"{BASE}/admin/plan", headers={"authorization": f"Bearer {DEV_ADMIN_KEY}"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        plan = json.loads(resp.read())
    assert {p["pool"] for p in plan["placements"]} == {"prefill", "decode", "mixed"}
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{BASE}/admin/plan", timeout=5)
    assert err.value.code == 401
    err.value.close()

    isle = str(Path(sys.executable).parent / "isle")
    status = subprocess.run([isle, "status"], capture_output=True, text=True, timeout=30, check=True).stdout
    assert f"policy {plan['policy']}" in status and "nodes:" in status, status
    for p in plan["placements"]:  # every planned replica, on its planned node and GPUs
        gpus = ",".join(str(g) for g in p["gpus"])
        assert any(p["replica_id"] in line and f"{p['node']}:[{gpus}]" in line for line in status.splitlines()), status
    drawing = Path(tempfile.mkdtemp()) / "deployment.svg"
    as_json = json.loads(subprocess.run([isle, "status", "--format", "json", "--draw", str(drawing)],
                                        capture_output=True, text=True, timeout=60, check=True).stdout)
    assert as_json["plan"]["placements"] == plan["placements"]
    # the streamed long prompt went prefill -> decode: its pair is judged, and drawn in its verdict's colour
    pair = {p["pair"]: p for p in as_json["replicas"]["kv_paths"]["pairs"]}["prefill-0->decode-0"]
    assert pair["verdict"] in VERDICT_COLOURS and pair["samples"] >= 1
    assert f'stroke: {VERDICT_COLOURS[pair["verdict"]]}' in drawing.read_text()
    refused = subprocess.run([isle, "status", "--admin-key", "wrong"], capture_output=True, text=True, timeout=30,
                             check=False)
    assert refused.returncode == 1 and "check --admin-key" in refused.stderr


def _unauthenticated(port: int, command: str, services: dict[str, str]) -> str | None:
    """What an unauthenticated caller reaches on this port (None: nothing but refusals or
    read-only metrics)."""
    answer = http_answer(port)
    if answer is None:  # gRPC: every service it serves must refuse a call without Ray's token
        served = {s: code for s, code in grpc_statuses(port, services).items() if code != "UNIMPLEMENTED"}
        if not served:
            return "a gRPC port that serves none of Ray's services"
        opened = {s: code for s, code in served.items() if code != "UNAUTHENTICATED"}
        return f"gRPC without a token: {opened}" if opened else None
    status, body = answer
    if port == 8000:  # the router: its API and admin routes need keys
        refused: dict[str, tuple[int, bytes] | None] = {
            path: http_answer(port, path=path) for path in ("/v1/models", "/admin/plan", "/admin/replicas")}
        let_in = [path for path, a in refused.items() if a is None or a[0] != 401]
        return f"router routes without a key: {let_in}" if let_in else None
    if "sim-engine" in command:  # an engine: its API wants the key only the router has; no admin routes
        api = [http_answer(port, method, path) for method, path in (("GET", "/v1/models"),
                                                                    ("POST", "/v1/chat/completions"))]
        admin = [http_answer(port, method, "/admin/faults") for method in ("GET", "POST")]
        if not all(a is not None and a[0] == 401 for a in api):
            return f"engine API without its key: {api}"
        return None if all(a is not None and a[0] == 404 for a in admin) else f"engine admin routes: {admin}"
    if status in (401, 403):
        return None
    post = http_answer(port, "POST")
    if status == 200 and body.startswith(b"# HELP") and post is not None and post[0] == 405:
        return None  # a Prometheus exporter: read-only
    return f"HTTP {status} without credentials: {body[:80]!r}"


def test_every_listener_is_loopback_and_none_runs_code_unauthenticated(product: Child) -> None:
    """Every TCP listener of the run (Ray's head, workers, agents, Serve, the router, the engines)
    is bound to loopback, and none answers an unauthenticated caller with more than a refusal or
    read-only metrics: Ray's gRPC services want the run's token, the router its keys, and the
    engines have no fault-injection routes."""
    found = listeners(process_tree(product.pid))
    assert len(found) >= 8, found  # GCS, raylet, workers, the router, four engines at least
    exposed = [f for f in found if not f.loopback]
    assert not exposed, f"listening beyond loopback: {exposed}"
    services = ray_services()
    opened = {f"{f.port} {f.command[:60]}": why for f in found
              if (why := _unauthenticated(f.port, f.command, services)) is not None}
    assert not opened, "\n".join(f"{k}: {v}" for k, v in opened.items())
    ray_processes = [f for f in found if "gcs_server" in f.command]
    assert ray_processes and all("/tmp/ray/" not in f.command for f in ray_processes)  # its own temp dir
    # Ray makes its temp dir 0777: it must sit in a directory nobody else may enter (a link planted
    # in its logs made Ray's log monitor print the token)
    logs = re.search(r"--log_dir=(\S+)", ray_processes[0].command)
    assert logs is not None
    private = Path(logs.group(1)).parents[2]  # <private>/ray/session_*/logs
    assert private.name.startswith("isle-ray-") and stat.S_IMODE(private.stat().st_mode) == 0o700, private
